"""Fair share and start-rate limits with real daemons (docs/guide/limits.md, schema 33):
three daemons never start a rate-limited handler's jobs faster than its rate, even with
one killed with SIGKILL mid-run, and wake for the next token instead of polling; a fair
daemon starts each key's first job within the first round. Starts are read from the
database (attempts.started_at: the claim's time), never from the handlers' clocks."""

from __future__ import annotations

import itertools
import signal
import time

from daemon_harness import Daemons, Db, wait_for

WORK = "jobhandlers:work"


def starts(db: Db) -> list[dict[str, object]]:
    """Every attempt's claim time and its job's key, oldest first."""
    return db.rows(
        "SELECT extract(epoch FROM a.started_at)::float8 AS at, j.concurrency_key AS key "
        "FROM {schema}.attempts a JOIN {schema}.jobs j ON j.id = a.job_id "
        "WHERE a.started_at IS NOT NULL ORDER BY a.started_at"
    )


def most_in_window(times: list[float], window: float) -> int:
    """The most starts in any half-open window [t, t + window)."""
    times = sorted(times)
    most = j = 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


def finished(db: Db, ids: list[int]) -> bool:
    return all(db.job(i)["status"] in ("completed", "dead") for i in ids)


def test_three_daemons_hold_the_rate_with_one_killed(db: Db, daemons: Daemons) -> None:
    # poll_interval 30 s: at 4 starts a second, only waking for the next token keeps the
    # rate anywhere near its limit
    handlers = {"rec": {"target": WORK, "rate": "4/s", "lease": "3s"}}
    worker = {"slots": 3, "poll_interval": "30s", "renew_interval": "1s"}
    ids = [db.enqueue("rec", {"seconds": 0.3}) for _ in range(48)]
    running = [daemons.start(handlers, worker, tag=tag) for tag in "ABC"]
    time.sleep(3)
    running[0].send(signal.SIGKILL)  # mid-run: its jobs are rescued when their leases end
    running[0].wait_exit()
    wait_for(lambda: finished(db, ids), timeout=90, what="every job to finish")
    times = [float(s["at"]) for s in starts(db)]  # type: ignore[arg-type]
    assert len(times) >= 48
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.25 - 1e-6, min(gaps)  # one token every 0.25 s, never two
    assert most_in_window(times, 1.0) <= 4
    # and the rate is used while work is due (loaded CI: a generous bound), woken by
    # the tokens, not by the 30 s poll
    span = times[-1] - times[0]
    assert len(times) / span >= 4 * 0.5, (len(times), span)


def test_a_fair_daemon_starts_every_key_in_the_first_round(db: Db, daemons: Daemons) -> None:
    ids = [db.enqueue("rec", {"seconds": 0}, concurrency_key="a") for _ in range(30)]
    ids += [
        db.enqueue("rec", {"seconds": 0}, concurrency_key=key) for key in "bcd" for _ in range(3)
    ]
    daemons.start({"rec": {"target": WORK, "fair": True}}, {"slots": 1})
    wait_for(lambda: finished(db, ids), timeout=60, what="every job to finish")
    order = [s["key"] for s in starts(db)]
    assert sorted(order[:4]) == ["a", "b", "c", "d"], order[:8]
    # FIFO would have run 30 jobs of a first; fair, b, c and d are done within 12 starts
    assert {"b", "c", "d"}.isdisjoint(order[12:]), order
