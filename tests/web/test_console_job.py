"""The job page for long jobs (issue 27 item 1), in real headless Chromium against real
daemons: the live log tail follows what the attempt prints (the source `logs -f` reads),
without reloading the page; a progress bar with elapsed time and an ETA when the progress
states a fraction; tracebacks collapsed; attempts numbered uniquely across retries. The
tail's endpoint is bounded and checks its cursor."""

from __future__ import annotations

import json
import re
from typing import Any

from daemon_harness import Daemons, Db, wait_for
from dashboard_harness import (
    Http,
    RunningDashboard,
    confirm,
    log_in,
    screenshot,
    text_of,
    wait_browser,
)

HANDLERS = {
    "report": {"target": "consolehandlers:report"},
    "scroll": {"target": "consolehandlers:scroll"},
    "fail": {"target": "jobhandlers:fail"},
}


def test_the_log_tail_follows_a_running_job_with_its_progress_bar_and_eta(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    job = db.enqueue("report", {"ticks": 400, "every": 0.3})
    db.wait_status(job, "running")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{job}")
    browser.execute_script("window.notReloaded = true")
    wait_browser(browser, lambda d: f"tick 2 of job {job}" in text_of(d, "log-tail"), "tick 2")
    wait_browser(browser, lambda d: f"tick 8 of job {job}" in text_of(d, "log-tail"), "tick 8")
    assert browser.execute_script("return window.notReloaded") is True
    # the tail sits above the payload
    assert browser.execute_script(
        "return document.getElementById('log-tail').compareDocumentPosition("
        "document.getElementById('payload')) & Node.DOCUMENT_POSITION_FOLLOWING"
    )
    lines = [ln for ln in text_of(browser, "log-tail").splitlines() if ln.startswith("tick")]
    numbers = [int(ln.split()[1]) for ln in lines]
    assert numbers == list(range(len(numbers)))  # every line once, in order
    assert text_of(browser, "log-tail").startswith("--- attempt 1 ---")
    # follow keeps the view at the end of the output
    wait_browser(
        browser,
        lambda d: d.execute_script(
            "var e = document.getElementById('log-tail');"
            "return e.scrollHeight > e.clientHeight && "
            "e.scrollTop + e.clientHeight >= e.scrollHeight - 2"
        ),
        "the tail scrolled to its end",
    )
    # the bar: step/of as a fraction, elapsed time and an estimate of what is left
    wait_browser(browser, lambda d: text_of(d, "job-eta"), "an ETA")
    percent = float(text_of(browser, "job-percent").rstrip("%"))
    assert 0 < percent < 100
    value = browser.execute_script(
        "return document.querySelector('#job-progress-bar progress').value"
    )
    assert abs(value / 10 - percent) <= 0.1
    assert text_of(browser, "job-elapsed")
    screenshot(browser, "job-log-tail")
    confirm(browser, "cancel")
    db.wait_status(job, "cancelled")
    wait_browser(browser, lambda d: "attempt ended" in text_of(d, "log-state"), "the end")


def test_following_a_log_past_its_cap_shows_each_line_once_and_says_what_was_left_out(
    http_client: Http, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS, tables={"logs": {"max_bytes_per_attempt": "8KiB"}})
    job = db.enqueue("scroll", {"lines": 600, "bursts": 12, "every": 0.4})
    cursor = {"ref": "", "head": "0", "omitted": "0", "tail": "0", "tailb": "0", "eol": "1"}
    text, polls = "", 0

    def poll() -> bool:
        nonlocal text, polls
        query = "&".join(f"{k}={v}" for k, v in cursor.items())
        reply = http_client.get(f"/live/jobs/{job}/log?{query}", headers={"X-Live": "1"})
        assert reply.status == 200, reply.body
        step = json.loads(reply.body)
        polls += 1
        if step["ref"]:
            assert cursor["ref"] in ("", step["ref"])
            cursor.update(
                {k: str(step[k]) for k in ("ref", "head", "omitted", "tail", "tailb", "eol")}
            )
            text += step["text"]
        return bool(step["ref"]) and step["finished"] and not step["more"]

    wait_for(poll, what="the attempt's end through the tail", timeout=60)
    assert db.job(job)["status"] == "completed"
    # the output the job printed, byte for byte (ASCII: a byte is a character); what the
    # page got is pieces of it in order, each gap said by a marker of its exact size
    printed = "".join(f"line {i:05d} ".ljust(99, "x") + "\n" for i in range(600))
    pieces = re.split(r"\n?\[\.\.\. (\d+) bytes omitted \.\.\.\]\n", text)
    left_out = sum(int(n) for n in pieces[1::2])

    def fits(n: int, at: int) -> bool:
        """Whether pieces[n:] are the printed bytes from `at` on: a line break before a
        marker is the job's own or the marker's (the page shows both alike), so both."""
        if n >= len(pieces):
            return at == len(printed)
        piece = pieces[n]
        ends = [at + len(piece)] if n == len(pieces) - 1 else [at + len(piece), at + len(piece) + 1]
        for end in ends:
            if printed[at:end].startswith(piece) and printed[at:end] in (piece, piece + "\n"):
                after = end + (int(pieces[n + 1]) if n + 1 < len(pieces) else 0)
                if fits(n + 2, after):
                    return True
        return False

    # every byte shown once or counted as left out, in order
    assert fits(0, 0), text[:2000]
    assert left_out > 0 and polls > 3
    # each marker on a line of its own
    assert all(ln.startswith("[...") for ln in text.splitlines() if "bytes omitted" in ln)


def test_the_tail_refuses_a_hostile_cursor(http_client: Http, db: Db) -> None:
    job = db.enqueue("report", {"ticks": 1})
    for query, why in (
        ("head=-1", "head must be a count"),
        ("tail=abc", "tail must be a count"),
        ("tailb=99999999999999999999", "tailb must be a count"),
        ("omitted=9999999999999", "omitted is larger than any log"),
        ("eol=2", "eol must be 0 or 1"),
        ("ref=../../etc", "ref must name an attempt"),
    ):
        reply = http_client.get(f"/live/jobs/{job}/log?{query}", headers={"X-Live": "1"})
        assert reply.status == 400 and why in reply.body, (query, reply.status)
    fine = http_client.get(f"/live/jobs/{job}/log", headers={"X-Live": "1"})
    assert fine.status == 200 and '"ref":""' in fine.body.replace(" ", "")


def test_attempts_are_numbered_across_retries_and_tracebacks_are_collapsed(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    job = db.enqueue("fail", {}, max_attempts=2)
    db.wait_status(job, "dead")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{job}")
    confirm(browser, "retry")
    wait_for(lambda: len(db.executions(job)) == 4, what="two more attempts")
    db.wait_status(job, "dead")
    wait_browser(
        browser, lambda d: len(d.find_elements("css selector", "#attempts tr")) == 5, "4 attempts"
    )
    # read in one script: the live refresh replaces these elements every second
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#attempts tr')).slice(1).map("
        "r => Array.from(r.querySelectorAll('td')).slice(0, 2).map(c => c.textContent))"
    )
    assert rows == [["1", "1"], ["2", "2"], ["3", "1"], ["4", "2"]]
    state = (
        "return [document.getElementById('attempt-error-4').open, "
        "document.querySelector('#attempt-error-4 summary').textContent]"
    )
    is_open, gist = browser.execute_script(state)
    assert is_open is False and "boom on attempt 2" in gist  # collapsed: its gist shows
    browser.execute_script("document.querySelector('#attempt-error-4 summary').click()")
    assert browser.execute_script(state)[0] is True
    # it stays open across the live refreshes of the page
    count = "return Number(document.getElementById('job-live').dataset.refreshes || 0)"
    refreshes = browser.execute_script(count)
    wait_browser(browser, lambda d: d.execute_script(count) > refreshes + 1, "two refreshes")
    assert browser.execute_script(state)[0] is True
    screenshot(browser, "job-attempts")
