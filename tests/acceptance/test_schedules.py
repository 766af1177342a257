"""Periodic jobs with real daemons and a real PostgreSQL: exactly one job per tick across
three racing daemons (one killed and restarted), `skip` never running two at once, a
single catch-up run after the whole fleet was down, config errors, `schedules --json`.

Ticks are recorded in schedule_runs (unique on schedule and tick, the job created in the
same transaction); the handler records each execution's interval in `executions`."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from daemon_harness import PGWORKERD, Daemons, Db, _toml_value, wait_for

HANDLERS = {"work": {"target": "jobhandlers:work"}}


def config_with_schedules(
    daemons: Daemons, schedules: dict[str, dict[str, Any]], *, slots: int = 2
) -> Path:
    path = daemons.config(HANDLERS, {"slots": slots})
    lines = [path.read_text()]
    for name, keys in schedules.items():
        lines.append(f"[schedules.{name}]")
        for key, value in keys.items():
            if isinstance(value, dict):
                inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def runs(db: Db, schedule: str) -> list[dict[str, Any]]:
    return db.rows(
        "SELECT tick, job_id, skipped, fired_by, fired_at FROM {schema}.schedule_runs "
        "WHERE schedule = %s ORDER BY tick",
        [schedule],
    )


def test_three_daemons_fire_exactly_one_job_per_tick(daemons: Daemons, db: Db) -> None:
    config = config_with_schedules(
        daemons,
        {"every_second": {"every": "1s", "handler": "work", "overlap": "allow"}},
        slots=4,
    )
    a = daemons.start(config, tag="A")
    b = daemons.start(config, tag="B")
    c = daemons.start(config, tag="C")
    started = time.monotonic()
    killed_at = restarted_at = None
    while time.monotonic() - started < 60:
        elapsed = time.monotonic() - started
        if killed_at is None and elapsed > 15:
            b.send(signal.SIGKILL)  # mid-flight: B may hold the lock on a tick right now
            b.wait_exit()
            killed_at = elapsed
        if killed_at is not None and restarted_at is None and elapsed > 30:
            b = daemons.start(config, tag="B2")
            restarted_at = elapsed
        time.sleep(0.2)
    for d in (a, b, c):
        d.send(signal.SIGTERM)
    for d in (a, b, c):
        d.wait_exit()

    rows = runs(db, "every_second")
    ticks = [r["tick"] for r in rows]
    assert len(rows) >= 50, f"only {len(rows)} ticks fired in a minute"
    # no tick twice (the primary key), and none missing: two daemons were always up
    seconds = [int(t.timestamp()) for t in ticks]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), "a tick is missing"
    # exactly one job per tick: every job of the handler belongs to exactly one run
    jobs = db.rows("SELECT id FROM {schema}.jobs WHERE handler = 'work' ORDER BY id")
    assert sorted(r["job_id"] for r in rows) == [j["id"] for j in jobs]
    assert all(r["skipped"] is None for r in rows)  # overlap = allow
    lateness = sorted((r["fired_at"] - r["tick"]).total_seconds() for r in rows)
    print(
        f"{len(rows)} ticks; fired after the tick: p50 {lateness[len(lateness) // 2]:.3f}s, "
        f"max {lateness[-1]:.3f}s; by {Counter(r['fired_by'].split(':')[1] for r in rows)}"
    )
    fired_by = {r["fired_by"].split(":")[1] for r in rows}
    assert len(fired_by) >= 2, "expected several daemons to win ticks"
    # the jobs ran (the fired job wakes claimers through enqueue's NOTIFY)
    wait_for(
        lambda: len(db.executions()) >= len(rows) - 5,
        what="the scheduled jobs to run",
    )


def test_skip_never_runs_two_at_once_and_records_skipped_ticks(daemons: Daemons, db: Db) -> None:
    # each run takes 2.5 s on a one-second schedule; two daemons could run it twice at once
    config = config_with_schedules(
        daemons,
        {
            "slow": {
                "every": "1s",
                "handler": "work",
                "overlap": "skip",
                "payload": {"seconds": 2.5},
            }
        },
    )
    daemons.start(config, tag="A")
    daemons.start(config, tag="B")
    wait_for(
        lambda: len([e for e in db.executions() if e["ended_at"]]) >= 3,
        timeout=60,
        what="three finished runs",
    )
    rows = runs(db, "slow")
    skipped = [r for r in rows if r["skipped"]]
    assert skipped, "ticks during a run must be recorded as skipped"
    assert all("overlap skip" in r["skipped"] for r in skipped)
    executions = db.executions()
    intervals = sorted((e["started_at"], e["ended_at"] or e["alive_at"]) for e in executions)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, f"two runs overlapped: {intervals}"
    # one job per fired tick, and each ran once
    fired = [r["job_id"] for r in rows if r["job_id"] is not None]
    assert len(set(fired)) == len(fired)


def test_after_the_whole_fleet_was_down_at_most_one_catch_up_run(daemons: Daemons, db: Db) -> None:
    config = config_with_schedules(
        daemons,
        {"tick": {"every": "1s", "handler": "work", "overlap": "allow", "catch_up": "last"}},
    )
    a = daemons.start(config, tag="A")
    wait_for(lambda: len(runs(db, "tick")) >= 3, what="three ticks")
    a.send(signal.SIGKILL)
    a.wait_exit()
    time.sleep(0.5)  # a fire in flight at the kill is committed or gone by now
    before = runs(db, "tick")[-1]["tick"]
    down_until = datetime.now(UTC) + timedelta(seconds=8)
    while datetime.now(UTC) < down_until:  # the whole fleet down across 8 ticks
        time.sleep(0.2)
    restarted = datetime.now(UTC)
    daemons.start(config, tag="A2")
    wait_for(
        lambda: len([r for r in runs(db, "tick") if r["tick"] > restarted]) >= 3,
        what="ticks after the restart",
    )
    missed = [r for r in runs(db, "tick") if before < r["tick"] <= restarted]
    assert len(missed) <= 1, f"a burst of missed ticks: {missed}"
    # and no burst right after the restart either: one job per second from then on
    after = [r["tick"] for r in runs(db, "tick") if r["tick"] > before]
    assert len(after) == len(set(after))
    assert (after[-1] - after[0]).total_seconds() >= len(after) - 1


def test_config_errors_name_file_and_line(tmp_path: Path) -> None:
    cases = {
        'cron = "0 25 * * *"\nhandler = "h"': (2, "bad cron expression"),
        'cron = "0 3 * * *"\ntimezone = "Europe/Nowhere"\nhandler = "h"': (3, "unknown time zone"),
        'cron = "0 3 * * *"\nevery = "1h"\nhandler = "h"': (1, "exactly one of"),
        'every = "0s"\nhandler = "h"': (2, "must be longer than zero"),
    }
    for body, (line, expected) in cases.items():
        path = tmp_path / "bad.toml"
        path.write_text(f"[schedules.nightly]\n{body}\n")
        proc = subprocess.run(
            [str(PGWORKERD), "--config", str(path), "check-config"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 3, proc.stderr
        assert f"{path}:{line}: " in proc.stderr and expected in proc.stderr, proc.stderr


def test_schedules_json_and_text(daemons: Daemons, db: Db) -> None:
    config = config_with_schedules(
        daemons,
        {
            "often": {"every": "1s", "handler": "work", "payload": {"seconds": 0}},
            "nightly": {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "handler": "work"},
        },
    )
    a = daemons.start(config, tag="A")
    wait_for(lambda: runs(db, "often"), what="a tick")
    wait_for(
        lambda: db.rows(
            "SELECT 1 FROM {schema}.schedule_runs r JOIN {schema}.jobs j ON j.id = r.job_id "
            "WHERE j.status = 'completed'"
        ),
        what="a completed scheduled job",
    )
    before = datetime.now(UTC)
    proc = daemons.cli("schedules", "--json")
    after = datetime.now(UTC)
    assert proc.returncode == 0, proc.stderr
    listed = {s["name"]: s for s in json.loads(proc.stdout)}
    assert set(listed) == {"often", "nightly"}
    often, nightly = listed["often"], listed["nightly"]
    assert often["definition"]["every"] == 1.0 and often["definition"]["handler"] == "work"
    assert often["declared_now"] is True and often["declared_by"] == a.worker_id
    assert often["last_job_status"] in ("pending", "running", "completed")
    assert isinstance(often["last_job_id"], int) and often["last_skipped"] is None
    # the first tick after the command's clock read, which came between before and after
    # (a loaded machine may take seconds to run the command)
    next_run = datetime.fromisoformat(often["next_run"])
    assert before < next_run <= after + timedelta(seconds=1)
    assert nightly["last_tick"] is None and nightly["last_job_id"] is None
    next_nightly = datetime.fromisoformat(nightly["next_run"])
    assert next_nightly.astimezone(datetime.now().astimezone().tzinfo) > datetime.now(UTC)
    from zoneinfo import ZoneInfo

    local = next_nightly.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (3, 0)

    text = daemons.cli("schedules")
    assert text.returncode == 0
    assert "often: every 1s, handler work on queue default, overlap skip; declared" in text.stdout
    assert "nightly: cron 0 3 * * * Europe/Berlin" in text.stdout

    # the daemon leaves: nobody declares the schedules any more
    a.send(signal.SIGTERM)
    a.wait_exit()
    listed = {s["name"]: s for s in json.loads(daemons.cli("schedules", "--json").stdout)}
    assert listed["often"]["declared_now"] is False
    assert "NOT DECLARED" in daemons.cli("schedules").stdout


def test_a_schedule_removed_from_the_config_stops_firing(daemons: Daemons, db: Db) -> None:
    config = config_with_schedules(
        daemons, {"beat": {"every": "1s", "handler": "work", "overlap": "allow"}}
    )
    a = daemons.start(config, tag="A")
    wait_for(lambda: len(runs(db, "beat")) >= 2, what="two ticks")
    config.write_text(config.read_text().split("[schedules.beat]")[0])
    a.send(signal.SIGHUP)
    a.wait_log("reloaded")
    time.sleep(0.5)  # a fire in flight at the reload is committed by now
    count = len(runs(db, "beat"))
    time.sleep(3)
    assert len(runs(db, "beat")) == count, "a removed schedule kept firing"
    listed = {s["name"]: s for s in json.loads(daemons.cli("schedules", "--json").stdout)}
    assert listed["beat"]["declared_now"] is False
    assert listed["beat"]["next_run"] is not None  # still computed from the stored definition


# A tick this far behind is past its grace (at most 60 s) by the time the daemon looks.
PAST_GRACE = 75.0
# ...and the next tick must not come while the test runs (it would be fired on time).
NEXT_TICK_AFTER = 240.0


def interval_between_ticks() -> int:
    """An `every` (10 to 15 minutes) whose latest tick is past its grace now and whose
    next is minutes away: no waiting for a tick to age (up to 75 s with one fixed
    interval), no tick of its own during the test. 600 when none fits (then it waits)."""
    now = time.time()
    for every in range(600, 901, 60):
        if PAST_GRACE <= now % every <= every - NEXT_TICK_AFTER:
            return every
    return 600


def test_catch_up_last_fires_the_latest_missed_tick_once_and_none_fires_nothing(
    daemons: Daemons, db: Db
) -> None:
    # catch_up only matters for a tick missed by more than its grace (at most 60 s), so
    # 10-to-15-minute schedules that nobody fired for an hour (declared an hour ago, no
    # runs)
    from pgworkerd.config import parse_config
    from pgworkerd.queue import schedules

    every = interval_between_ticks()
    keys = {"every": f"{every}s", "handler": "work", "overlap": "allow"}
    config = config_with_schedules(
        daemons,
        {"late_last": keys | {"catch_up": "last"}, "late_none": keys | {"catch_up": "none"}},
    )
    declared = parse_config(config.read_text()).schedules
    for name, schedule in declared.items():
        schedules.declare(db.conn, name, schedule.definition(), "earlier", db.schema)
    db.rows("UPDATE {schema}.schedules SET created_at = now() - interval '1 hour'")
    # the latest tick must be past its 60 s grace when the daemon looks, or "none" fires it
    # (interval_between_ticks chose one whose latest tick is; it waits only if none was)
    since_tick = time.time() % every
    if since_tick < PAST_GRACE:
        time.sleep(PAST_GRACE - since_tick)
    latest = datetime.fromtimestamp(time.time() // every * every, UTC)
    a = daemons.start(config, tag="A")
    # generous: a loaded machine may take long over the daemon's first turn
    a.wait_log(r"schedule late_none: missed tick \S+ not fired \(catch_up = none\)", timeout=120)
    wait_for(lambda: runs(db, "late_last"), timeout=120, what="the catch-up run")
    time.sleep(1)  # a burst would show by now
    [caught_up] = runs(db, "late_last")  # one run for the four to six missed ticks
    assert caught_up["tick"] == latest and caught_up["job_id"] is not None
    assert runs(db, "late_none") == []
    a.send(signal.SIGTERM)
    assert a.wait_exit() == 0
