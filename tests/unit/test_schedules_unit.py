"""Unit tests of periodic jobs without a database: the [schedules.NAME] config and its
file:line errors, the ticks (pgworkerd.cadence) and the Scheduler's decisions over a fake
clock and fake statements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fakes import FakeClock

from pgworkerd.cadence import Cadence, to_fire
from pgworkerd.config import ConfigError, parse_config
from pgworkerd.daemon.scheduler import Scheduler
from pgworkerd.queue.schedules import Fired


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/pgworkerd.toml")
    return str(info.value)


def test_schedule_values_and_defaults() -> None:
    config = parse_config(
        """
[handlers.report]
target = "app.jobs:report"
queue = "reports"

[schedules.nightly]
cron = "0 3 * * *"
timezone = "Europe/Berlin"
handler = "report"
payload = { kind = "full", days = [1, 2] }
priority = -5
max_attempts = 2
overlap = "queue_one"

[schedules.ping]
every = "15m"
handler = "elsewhere"
catch_up = "none"
""",
        "x.toml",
    )
    nightly, ping = config.schedules["nightly"], config.schedules["ping"]
    assert nightly.queue == "reports"  # the handler's queue
    assert nightly.job() == {
        "handler": "report",
        "payload": {"kind": "full", "days": [1, 2]},
        "queue": "reports",
        "priority": -5,
        "max_attempts": 2,
    }
    assert (nightly.overlap, nightly.catch_up, nightly.timezone) == (
        "queue_one",
        "last",
        "Europe/Berlin",
    )
    assert ping.every == 900.0 and ping.cron == "" and ping.queue == "default"
    assert (ping.overlap, ping.catch_up) == ("skip", "none")
    assert "max_attempts" not in ping.job()


@pytest.mark.parametrize(
    ("body", "line", "expected"),
    [
        ('cron = "61 * * * *"\nhandler = "h"', 3, "schedules.s.cron: bad cron expression"),
        ('cron = "* * *"\nhandler = "h"', 3, "bad cron expression"),
        ('cron = "0 3 * * *"\ntimezone = "Mars/Base"\nhandler = "h"', 4, "unknown time zone"),
        ('cron = "0 3 * * *"\nevery = "1m"\nhandler = "h"', 2, "exactly one of"),
        ('handler = "h"', 2, "not neither"),
        ('every = "0s"\nhandler = "h"', 3, "schedules.s.every: must be longer than zero"),
        ('every = "1.5s"\nhandler = "h"', 3, "whole seconds"),
        ('every = "-1"\nhandler = "h"', 3, "schedules.s.every"),
        ('every = "1m"\nhandler = "h"\nbogus = 1', 5, "schedules.s.bogus: unknown key"),
        ('every = "1m"\nhandler = "h"\noverlap = "never"', 5, "expected one of skip"),
        ('every = "1m"\nhandler = "h"\ncatch_up = "all"', 5, "expected one of last, none"),
        ('every = "1m"\nhandler = "h"\npriority = 99999', 5, "schedules.s.priority"),
        ('every = "1m"\nhandler = "h"\npayload = "x"', 5, "expected a table"),
        ('every = "1m"\nhandler = "h"\npayload = { at = 1979-05-27 }', 5, "payload: not JSON"),
        # what jsonb cannot store would fail every tick's enqueue, forever: refused here
        ('every = "1m"\nhandler = "h"\npayload = { s = "a\\u0000b" }', 5, "NUL character"),
        (
            'every = "1m"\nhandler = "h"\npayload = ' + "{ a = " * 256 + "1" + " }" * 256,
            5,
            "schedules.s.payload: nested deeper than 255 levels",
        ),
        ('every = "1m"\nhandler = "h"\ntimezone = "UTC"', 5, 'applies to "cron" only'),
        ('every = "1m"\nhandler = " h"', 4, "schedules.s.handler"),
        ('every = "1m"', 2, 'missing key "handler"'),
    ],
)
def test_schedule_errors_name_file_key_and_line(body: str, line: int, expected: str) -> None:
    message = error_of(f"\n[schedules.s]\n{body}\n")
    assert message.startswith(f"/etc/pgworkerd.toml:{line}: "), message
    assert expected in message


def test_a_payload_as_deep_as_enqueue_takes_is_accepted() -> None:
    # enqueue_valid (migration 0008) refuses a value 256 levels below the payload; 255 is fine
    config = parse_config(
        '[schedules.s]\nevery = "1m"\nhandler = "h"\npayload = '
        + "{ a = " * 255
        + "[]"
        + " }" * 255
        + "\n"
    )
    assert config.schedules["s"].payload["a"]["a"]


def test_bad_schedule_name_is_refused_like_a_handler_name() -> None:
    message = error_of('\n[schedules." bad"]\nevery = "1m"\nhandler = "h"\n')
    assert message.startswith("/etc/pgworkerd.toml:2: [schedules.' bad']:")
    assert "whitespace" in message


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_interval_ticks_on_multiples_since_the_epoch() -> None:
    c = Cadence({"every": 900.0})
    assert c.previous(at("2026-01-01T10:07:00+00:00")) == at("2026-01-01T10:00:00+00:00")
    assert c.next_after(at("2026-01-01T10:00:00+00:00")) == at("2026-01-01T10:15:00+00:00")
    assert c.due(at("2026-01-01T10:00:00+00:00"), at("2026-01-01T10:31:00+00:00")) == [
        at("2026-01-01T10:15:00+00:00"),
        at("2026-01-01T10:30:00+00:00"),
    ]


def test_cron_ticks_in_the_zone_across_dst() -> None:
    c = Cadence({"cron": "30 2 * * *", "timezone": "Europe/Berlin"})
    # 2026-03-29 02:30 does not exist in Berlin: cron runs it when the clocks jump (03:00)
    ticks = c.due(at("2026-03-27T12:00:00+00:00"), at("2026-03-30T12:00:00+00:00"))
    assert ticks == [
        at("2026-03-28T02:30:00+01:00"),
        at("2026-03-29T03:00:00+02:00"),
        at("2026-03-30T02:30:00+02:00"),
    ]
    # 2026-10-25 02:30 happens twice: once, the first time
    ticks = c.due(at("2026-10-24T12:00:00+00:00"), at("2026-10-25T12:00:00+00:00"))
    assert ticks == [at("2026-10-25T02:30:00+02:00")]


def test_to_fire_on_time_late_turn_and_catch_up() -> None:
    every_second = Cadence({"every": 1.0})
    t0 = at("2026-01-01T00:00:00+00:00")
    s = timedelta(seconds=1)
    # on time: the one due tick
    assert to_fire(every_second, t0, t0 + 1.2 * s, "last") == ([t0 + s], t0 + s)
    # a loop turn 1.5 s late: both ticks, still within the grace
    assert to_fire(every_second, t0, t0 + 2.5 * s, "none")[0] == [t0 + s, t0 + 2 * s]
    # the fleet was down for a minute: one catch-up tick ("last"), or none late
    assert to_fire(every_second, t0, t0 + 60.5 * s, "last") == ([t0 + 60 * s], t0 + 60 * s)
    assert to_fire(every_second, t0, t0 + 60.5 * s, "none") == ([t0 + 60 * s], t0 + 60 * s)
    hourly = Cadence({"every": 3600.0})
    assert to_fire(hourly, t0, t0 + 7300 * s, "last")[0] == [t0 + 7200 * s]
    # 100 s late is past the 60 s grace: "none" fires nothing
    assert to_fire(hourly, t0, t0 + 7300 * s, "none") == ([], t0 + 7200 * s)


# -- the Scheduler over fakes -----------------------------------------------------------------


@dataclass
class FakeScheduleStatements:
    """The schedule statements over an in-memory table of runs; `ok` is the link."""

    ok: bool = True
    handled: datetime = field(default_factory=lambda: at("2026-01-01T00:00:00+00:00"))
    runs: dict[tuple[str, datetime], int] = field(default_factory=dict)
    failing: bool = False
    declared: list[str] = field(default_factory=list)
    undeclared: set[str] = field(default_factory=set)  # no operator declared these

    def declare_schedule(self, name: str, definition: dict[str, Any]) -> datetime | None:
        return self.handled if self.ok and name not in self.undeclared else None

    def set_declared_schedules(self, names: Sequence[str]) -> bool | None:
        self.declared = list(names)
        return True

    def fire_schedule(self, name: str, tick: datetime) -> Fired | None:
        if self.failing:
            return None
        if (name, tick) in self.runs:
            return Fired("taken", None)
        self.runs[name, tick] = len(self.runs) + 1
        return Fired("fired", self.runs[name, tick])


CONFIG = """
[schedules.s]
every = "10s"
handler = "h"
"""


def test_scheduler_fires_each_tick_once_and_sleeps_until_the_next() -> None:
    wall = FakeClock(at("2026-01-01T00:00:05+00:00").timestamp())  # time.time()
    mono = FakeClock(100.0)  # time.monotonic()
    fake = FakeScheduleStatements()
    scheduler = Scheduler(parse_config(CONFIG), fake, wall)
    scheduler.tick(mono())
    assert fake.declared == ["s"] and fake.runs == {}  # 00:00:00 was handled already
    assert scheduler.next_deadline() == pytest.approx(105.0, abs=0.01)
    for step in range(1, 4):
        wall.advance(10)
        scheduler.tick(mono.advance(10))
        assert len(fake.runs) == step
    assert sorted(t for _, t in fake.runs) == [
        at("2026-01-01T00:00:10+00:00"),
        at("2026-01-01T00:00:20+00:00"),
        at("2026-01-01T00:00:30+00:00"),
    ]


def test_a_schedule_no_operator_declared_waits_and_the_others_fire() -> None:
    """Schema 22: the daemon role fires only what an operator declared; one schedule of
    the config not declared yet must not hold back the others, and fires once it is."""
    wall = FakeClock(at("2026-01-01T00:00:05+00:00").timestamp())
    mono = FakeClock(100.0)
    two = parse_config(CONFIG + '[schedules.t]\nevery = "10s"\nhandler = "h"\n')
    fake = FakeScheduleStatements(undeclared={"t"})
    scheduler = Scheduler(two, fake, wall)
    scheduler.tick(mono())
    assert fake.declared == ["s"]
    wall.advance(10)
    scheduler.tick(mono.advance(10))
    assert [name for name, _ in fake.runs] == ["s"]
    fake.undeclared.clear()  # the operator declares it
    wall.advance(10)
    scheduler.tick(mono.advance(10))
    assert fake.declared == ["s", "t"]
    assert sorted(name for name, _ in fake.runs) == ["s", "s", "t"]


def test_scheduler_looks_at_the_wall_clock_again_within_half_a_minute() -> None:
    # a nightly tick hours away: the monotonic clock stands still while the host is
    # suspended and the wall clock may be stepped, so the tick is not waited for blindly
    wall = FakeClock(at("2026-01-01T00:00:05+00:00").timestamp())
    nightly = parse_config('[schedules.n]\ncron = "0 3 * * *"\nhandler = "h"\n')
    fake = FakeScheduleStatements()
    scheduler = Scheduler(nightly, fake, wall)
    scheduler.tick(100.0)
    deadline = scheduler.next_deadline()
    assert deadline is not None and 100.0 < deadline <= 130.1
    wall.advance(3 * 3600)  # suspended for three hours: the monotonic clock did not move
    scheduler.tick(deadline)
    assert list(fake.runs) == [("n", at("2026-01-01T03:00:00+00:00"))]


def test_scheduler_after_an_outage_catches_up_once_and_survives_failures() -> None:
    wall = [at("2026-01-01T00:00:05+00:00").timestamp()]
    fake = FakeScheduleStatements()
    scheduler = Scheduler(parse_config(CONFIG), fake, lambda: wall[0])
    scheduler.tick(0.0)
    fake.failing = True
    wall[0] += 10
    scheduler.tick(10.0)  # the fire fails: nothing recorded, tried again later
    assert fake.runs == {}
    assert scheduler.next_deadline() == pytest.approx(15.0)
    fake.failing = False
    fake.ok = False
    wall[0] += 600  # ten minutes without a database
    assert scheduler.next_deadline() is None
    fake.ok = True
    scheduler.redeclare()
    scheduler.tick(620.0)
    assert list(fake.runs) == [("s", at("2026-01-01T00:10:10+00:00"))]  # one, the latest


def test_the_example_schedule_is_valid() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "config.example.toml").read_text()
    block = text[text.index("# [schedules.") :]
    # uncomment the table and its keys (not the explanations); keep one of cron and every
    enabled = re.sub(r"(?m)^# (\[schedules\.\w+\]|[a-z_]+ = .*)$", r"\1", block)
    enabled = enabled.replace('\nevery = "15m"', "")
    config = parse_config(text[: text.index("# [schedules.")] + enabled, "example")
    [schedule] = config.schedules.values()
    assert (schedule.cron, schedule.timezone, schedule.handler) == (
        "0 3 * * *",
        "Europe/Berlin",
        "echo",
    )


def test_a_year_of_missed_minutes_is_one_catch_up_tick_found_without_walking_them() -> None:
    import time

    every_minute = Cadence({"cron": "* * * * *", "timezone": "Europe/Berlin"})
    now = at("2026-06-01T12:00:30+00:00")
    # CPU time, not wall time: a busy machine can deschedule the test for longer than the
    # bound, but cannot make the computation itself cost more (~0.1 ms when quiet).
    started = time.process_time()
    ticks, latest = to_fire(every_minute, now - timedelta(days=365), now, "last")
    assert ticks == [at("2026-06-01T12:00:00+00:00")] == [latest]
    assert time.process_time() - started < 0.5  # 525,600 ticks one by one take seconds
