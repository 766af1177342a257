"""Unit tier: notifications are hints, never authority (audit 2026-11-26, N1). What each
kind of notification on the wake channel may make a daemon do, and how often: the
audit's 5,000 made-up peers change nothing the daemon ranks, polls or waits by; a flood
is decoded up to a budget and becomes one plain wake-up; hand-ons, rescue hints, drain
hints and registry reads are rate-limited. The same attack against real daemons and a
real database, by a role with no grant: tests/fault/test_wake_spoofing.py."""

from __future__ import annotations

import json
import logging
import random

import pytest
from fakes import ClaimerRig, FakeClock, FakeStatements, claimed_job, config

from pgworkerd.daemon.claimer import FORWARD_BURST, FORWARD_RATE, PLAIN_WAKE
from pgworkerd.daemon.hints import PARSE_BURST, PARSE_RATE, RateLimit, WakeHints
from pgworkerd.daemon.peers import FLEET_POLLERS, Peer, Peers, parse
from pgworkerd.daemon.presence import HINT_JITTER, HINTED_REFRESH, PEERS_REFRESH, Presence

CONFIG = """
[worker]
slots = 1
poll_interval = "5s"
lease = "60s"
renew_interval = "10s"
warm_children = 1
"""


def fleet(n: int, me: int = 0) -> Peers:
    peers = Peers(f"d{me}")
    peers.replace([Peer(f"d{i}", frozenset({"default"}), frozenset({"h"})) for i in range(n)])
    return peers


def fake_peers(n: int) -> list[str]:
    """The audit's fake_peers.sql: n made-up daemons serving everything, a million slots."""
    return [
        json.dumps(
            {"peer": "up", "id": f"fake-{g}", "queues": ["default"], "handlers": ["h"]}
            | {"slots": 1_000_000}
        )
        for g in range(1, n + 1)
    ]


class Rig(ClaimerRig):
    """A claimer fed by WakeHints; registry reads and drain hints asked for are counted."""

    def __init__(self, peers: Peers, text: str = CONFIG) -> None:
        super().__init__(text, idle=2, peers=peers, listening=lambda: True, rng=random.Random(1))
        self.registry_reads_asked: list[float] = []
        self.drain_hints = 0
        self.hints = WakeHints(
            self.claimer, self.registry_reads_asked.append, self._drain, self.clock
        )
        self.tick()  # the first claim (a poll)

    def _drain(self) -> None:
        self.drain_hints += 1

    def receive(self, payloads: list[str]) -> None:
        self.hints.receive([(False, p) for p in payloads], self.clock())

    def claims(self) -> int:
        return len(self.statements.claim_calls)


def test_a_token_bucket_allows_its_burst_then_its_rate() -> None:
    clock = FakeClock()
    limit = RateLimit(10.0, 3.0, clock)
    assert [limit.allow() for _ in range(5)] == [True, True, True, False, False]
    clock.advance(0.1)
    assert [limit.allow() for _ in range(2)] == [True, False]
    clock.advance(100.0)  # the bucket holds its burst, no more
    assert sum(limit.allow() for _ in range(10)) == 3


def test_five_thousand_made_up_peers_change_nothing_the_daemon_ranks_or_waits_by() -> None:
    """The audit's attack: before, the fakes joined the ring (the wake-ups went to them),
    the poll stretched to 10 minutes and the registry read to 30."""
    rig = Rig(fleet(3, me=0))
    poll_before = rig.claimer.poll_period()
    rig.receive(fake_peers(5000))
    assert len(rig.claimer.peers or []) == 3  # only the registry's rows
    assert rig.claimer.poll_period() == poll_before == 5.0
    assert len(rig.registry_reads_asked) == 5000  # each only asks Presence (rate-limited)
    # a new job still wakes exactly the daemon it is for, among the real three
    views = [fleet(3, me) for me in range(3)]
    wake = parse(json.dumps({"q": "default", "h": "h", "id": 42, "n": 1}))
    assert sum(v.group(wake)[0] for v in views) == 1


def test_a_flood_is_decoded_up_to_a_budget_and_the_rest_is_one_plain_wake_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig(fleet(3, me=1))
    up = fake_peers(1)[0]
    with caplog.at_level(logging.WARNING, logger="pgworkerd"):
        rig.receive([up] * 20_000)
        rig.tick(0.05)
    assert len(rig.registry_reads_asked) == PARSE_BURST  # decoded: the burst, no more
    assert rig.claims() == 2  # the rest: one plain wake-up, one claim
    [warning] = [r for r in caplog.records if "wake channel flooded" in r.getMessage()]
    assert "15000 notifications" in warning.getMessage()
    # in the long run, PARSE_RATE a second are decoded
    rig.registry_reads_asked.clear()
    for _ in range(10):
        rig.clock.advance(1.0)
        rig.receive([up] * 10_000)
    assert len(rig.registry_reads_asked) <= 10.05 * PARSE_RATE + 1
    # and the warning comes at most once a minute
    assert len([r for r in caplog.records if "wake channel flooded" in r.getMessage()]) == 1


def test_drain_and_peer_notifications_only_ask_for_reads() -> None:
    rig = Rig(fleet(3))
    rig.receive(['{"registry": "drain"}'] * 100 + ['{"peer": "down", "id": "d1"}'])
    assert rig.drain_hints == 100  # each an early heartbeat, spaced by Presence
    assert len(rig.claimer.peers or []) == 3  # "down" removes nobody
    assert len(rig.registry_reads_asked) == 1
    assert rig.claims() == 1  # none of them is a claim


def test_made_up_wake_ups_for_a_full_daemon_hand_on_a_bounded_number() -> None:
    """Each hand-on is a statement: 5,000 made-up wake-ups naming this daemon's handler
    while its slot is full were 5,000 statements in one loop turn."""
    views = [fleet(10, me) for me in range(10)]
    rig = Rig(fleet(10, me=0))
    rig.statements.claims = [([claimed_job("h")], [])]
    rig.claimer.request()
    rig.tick()  # its one slot is taken
    mine = [
        json.dumps({"q": "default", "h": "h", "id": i, "n": 1})
        for i in range(20_000)
        if views[0].group(parse(json.dumps({"q": "default", "h": "h", "id": i, "n": 1})))[0]
    ][:3000]
    assert len(mine) > 1000
    rig.receive(mine)
    rig.tick()
    sent = rig.statements.sent_wakes
    assert len(sent) == FORWARD_BURST + 1 and sent[-1] == PLAIN_WAKE  # one plain wake-up
    for _ in range(10):  # sustained: FORWARD_RATE a second, a plain wake-up every 0.5 s
        rig.receive(mine[:500])
        rig.tick(1.0)
    assert len(sent) <= FORWARD_BURST + 1 + 10 * (FORWARD_RATE + 1)


def test_rescue_hints_cause_claims_no_faster_than_notifications() -> None:
    rig = Rig(fleet(1, me=0), text=CONFIG.replace('"5s"', '"600s"'))
    hint = {"q": "default", "h": "h", "holder": "elsewhere", "in": 0.001}
    for step in range(100):  # a hint due at once, every 5 ms for half a second
        rig.receive([json.dumps({"rescue": step} | hint)])
        rig.tick(0.005)
    assert rig.claims() <= 1 + 0.5 / 0.02 + 1


def presence(clock: FakeClock, peers: Peers, rows: int) -> tuple[Presence, FakeStatements]:
    statements = FakeStatements()
    statements.peer_rows = [(f"d{i}", ["default"], ["h"], 1) for i in range(rows)]
    p = Presence(
        config(CONFIG),
        "d0",
        # the lifecycle, link, table, notifier, metrics and queue-depth counter are not
        # used here: None, which their types refuse
        None,  # type: ignore[arg-type]
        statements,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        clock,
        peers=peers,
        rng=random.Random(3),
    )
    return p, statements


@pytest.mark.parametrize("fleet_size", [3, 100])
def test_peer_notifications_bring_the_registry_read_forward_rate_limited(
    fleet_size: int,
) -> None:
    clock = FakeClock()
    peers = Peers("d0", clock)
    p, _ = presence(clock, peers, fleet_size)
    p._refresh_peers(clock())
    assert len(peers) == fleet_size
    read_at = clock()
    gap = min(PEERS_REFRESH, HINTED_REFRESH * max(1.0, fleet_size / FLEET_POLLERS))
    for _ in range(5000):
        p.peers_changed(clock())
    assert read_at + gap <= p.peers_at <= read_at + gap + HINT_JITTER
    clock.advance(gap + HINT_JITTER)
    p._refresh_peers(clock())  # (the heartbeat tick does this when peers_at is due)
    for _ in range(5000):
        p.peers_changed(clock())
    assert p.peers_at >= clock() + gap  # a read just happened: not before the gap
