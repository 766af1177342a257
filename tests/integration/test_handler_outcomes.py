"""Handler-controlled outcomes against real daemons and a real PostgreSQL: a snooze runs the
job again after its delay without spending an attempt, bounded by max_snoozes and by the
longest delay; GiveUp and the exception types of no_retry end the job as dead at once;
other exceptions are still retried."""

from __future__ import annotations

from daemon_harness import Daemons, Db, wait_for

H = "outcomehandlers"


def test_a_snooze_runs_the_job_again_later_without_spending_an_attempt(
    daemons: Daemons, db: Db
) -> None:
    daemons.start({"snoozer": {"target": f"{H}:snooze_then_done"}})
    job_id = db.enqueue("snoozer", {"seconds": 2, "times": 2}, max_attempts=1)
    row = db.wait_status(job_id, "completed", "dead", timeout=60)
    assert row["status"] == "completed", row["last_error"]
    # twice snoozed for 2 s: each time back after ~2 s (not at once, not after a backoff)
    assert row["result"]["n"] == 2
    assert 1.9 <= row["result"]["waited"] < 15
    # max_attempts = 1: a snooze that spent an attempt would have ended it dead
    assert (row["attempts"], row["result"]["attempt"], row["snoozes"]) == (1, 1, 2)
    shown = daemons.cli("show", str(job_id))
    assert shown.returncode == 0 and "\nsnoozes: 2\n" in shown.stdout, shown


def test_snoozes_are_bounded_by_max_snoozes_and_by_their_length(daemons: Daemons, db: Db) -> None:
    daemons.start(
        {
            "snoozer": {"target": f"{H}:snooze_always", "max_snoozes": 2},
            "bad_snoozer": {"target": f"{H}:snooze_always"},
        }
    )
    forever = db.enqueue("snoozer", {"seconds": 0}, max_attempts=2)
    negative = db.enqueue("bad_snoozer", {"seconds": -1}, max_attempts=1)
    too_long = db.enqueue("bad_snoozer", {"seconds": 31 * 86400}, max_attempts=1)
    not_a_number = db.enqueue("bad_snoozer", {"seconds": "10"}, max_attempts=1)

    row = db.wait_status(forever, "dead", timeout=60)
    # two snoozes, then each further snooze is a failed attempt: two attempts, dead
    assert (row["snoozes"], row["attempts"]) == (2, 2)
    assert "snoozed 2 times already (max_snoozes of handler snoozer)" in row["last_error"]

    for job_id, what in (
        (negative, "not -1"),
        (too_long, f"not {31 * 86400}"),
        (not_a_number, "must be a number, not str"),
    ):
        row = db.wait_status(job_id, "dead", timeout=60)
        assert (row["snoozes"], row["attempts"]) == (0, 1)
        assert row["last_error"].startswith("Snooze seconds must be"), row["last_error"]
        assert what in row["last_error"]


def test_give_up_and_no_retry_end_the_job_dead_at_once_other_errors_retry(
    daemons: Daemons, db: Db
) -> None:
    daemons.start(
        {
            "quitter": {"target": f"{H}:give_up"},
            "raiser": {
                "target": f"{H}:raise_named",
                "no_retry": ["ValueError", f"{H}.PermanentError"],
            },
        }
    )
    gave_up = db.enqueue("quitter", {"reason": "customer deleted"}, max_attempts=5)
    named = {
        error: db.enqueue("raiser", {"error": error}, max_attempts=3)
        for error in ("ValueError", "UnicodeError", "PermanentError", "CustomerGone")
    }
    retried = db.enqueue("raiser", {"error": "RuntimeError"}, max_attempts=3)

    row = db.wait_status(gave_up, "dead", timeout=60)
    assert (row["attempts"], row["last_error"]) == (1, "customer deleted")
    for error, job_id in named.items():
        row = db.wait_status(job_id, "dead", timeout=60)
        assert row["attempts"] == 1, error
        assert row["last_error"].startswith(f"{error}: raised {error}")
        assert "is in no_retry of handler raiser" in row["last_error"]
    row = db.wait_status(retried, "dead", timeout=60)
    assert row["attempts"] == 3
    assert row["last_error"].startswith("RuntimeError: raised RuntimeError")


def test_retry_gives_a_job_dead_from_too_many_snoozes_its_snoozes_back(
    daemons: Daemons, db: Db
) -> None:
    """`pgworkerd retry` resets the snooze count with the attempts: the retried job can
    snooze max_snoozes times again (it used to die at its first snooze)."""
    daemons.start({"snoozer": {"target": f"{H}:snooze_always", "max_snoozes": 2}})
    job_id = db.enqueue("snoozer", {"seconds": 0}, max_attempts=1)

    def snoozed() -> int:
        [row] = db.rows(
            "SELECT count(*) AS n FROM {schema}.attempts WHERE job_id = %s AND outcome = 'snoozed'",
            (job_id,),
        )
        return int(row["n"])

    row = db.wait_status(job_id, "dead", timeout=60)
    assert (row["snoozes"], snoozed()) == (2, 2)

    retried = daemons.cli("retry", str(job_id))
    assert retried.returncode == 0, retried
    row = wait_for(
        lambda: (r := db.job(job_id))["status"] == "dead" and snoozed() >= 4 and r,
        timeout=60,
        what="the retried job to snooze twice more and die again",
    )
    assert snoozed() == 4
    # two more snoozes after the retry, then dead again from the third: a fresh count
    assert row["snoozes"] == 2, row
    assert "snoozed 2 times already" in row["last_error"], row["last_error"]
