"""Whose wake-up is it: the live daemons of the fleet, and which of them a notification
picks, so that one enqueue wakes one daemon instead of all of them.

The wake channel (schema 13) carries JSON notifications: new jobs from the jobs table's
trigger ({"q": queue, "h": handler, "id": lowest new id, "n": how many; since schema 40
also "skip", "next" and "hops"}, when a daemon of the group it is for has no channel of
its own: see below), peers coming
and going ({"peer": "up"|"down", "id": ...}), drain requests ({"registry": "drain"}),
wake-ups a daemon forwards because it cannot take them ({... "skip": k, "hops": h}), and
rescue hints: a running job whose lease was not renewed on time, for its rescuers
({"rescue": id, "q", "h", "holder": who holds it, "in": seconds until it runs out}).
Anything else is a plain wake-up, as every notification used to be.

Any role that can connect may NOTIFY (no grant is needed, not even on the schema), so a
notification is a hint, never authority (daemon/hints.py bounds what each kind may
cause): the peers are the registry's live rows, which only the daemon role can write,
and nothing else. A "peer up" or "down" only asks for an early, rate-limited registry
read; it never adds or removes a peer by itself.

Since schema 40 the database chooses (workers_wake, objects/workers.sql): a batch of new
jobs goes to the group of daemons ranked first for it, each on its own channel, which
every daemon LISTENs on beside the fleet's (DatabaseLink.own_channel). One enqueue then
wakes one daemon process instead of the fleet's, and a daemon takes a wake-up on its own
channel as its own (Claimer.woken, aimed) or hands it on through workers_wake. What
follows is how a daemon ranks what still comes on the fleet's channel (a group with an
older daemon, or one not listening: its row has no channel).

Which daemon a batch of jobs is for is a consistent hash of its lowest job id over the
peers that serve its queue and handler: every daemon computes the same answer from the
same registry rows, in O(log N) per notification (a ring with VNODES points per peer),
and the next ones on the ring take over when the first cannot (skip). A daemon that
does not know the fleet yet, is not in its own list, or has spent its ring-building
budget for now, claims: a wake-up may be taken twice, never dropped.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

VNODES = 16  # points per peer on the ring: an even share of jobs per daemon within ~25 %
MAX_PEERS = 5_000  # registry rows beyond this are not ranked
# Ring work, building rings (after a registry read changed the peers) and walking them
# (a wake-up for n jobs walks until the peers it found have n slots: the whole ring for
# a large n), may take at most this share of a core in the long run, with bursts of up
# to RING_BUDGET_BURST seconds: whatever the notifications name (any pair this daemon
# serves, any n), its cost per second is capped. Over budget, the ring from before a
# change serves, or the daemon takes the wake-up itself (a wake-up may be taken twice,
# never dropped). For a few dozen peers each costs microseconds.
RING_BUDGET_SHARE = 0.05
RING_BUDGET_BURST = 0.1
MAX_JOBS_PER_WAKE = 100_000  # "n" beyond this is treated as this many
# Work the fleet shares (the fallback poll, reading the registry) is done by each daemon
# in turn, about this many times per period by the fleet in all, whatever its size.
FLEET_POLLERS = 10
RESCUERS = 2  # daemons that wake for an expiring lease: the first, and one in case it cannot


@dataclass(frozen=True)
class Peer:
    id: str
    queues: frozenset[str]
    handlers: frozenset[str]
    slots: int = 1

    def serves(self, queue: str | None, handler: str | None) -> bool:
        return (queue is None or queue in self.queues) and (
            handler is None or handler in self.handlers
        )


@dataclass(frozen=True)
class Wake:
    """One notification, decoded. kind: "jobs", "up", "down", "drain", "rescue" or
    "any". Nothing in it is trusted: see daemon/hints.py for what each kind may cause."""

    kind: str
    queue: str | None = None
    handler: str | None = None
    job_id: int = 0
    count: int = 1
    skip: int = 0
    hops: int = 0
    next: int | None = None  # workers_wake's: where the group after this one starts
    peer_id: str = ""  # an up's or down's: only ever a reason to read the registry
    holder: str = ""  # a rescue hint's: who holds the job
    expires_in: float = 0.0  # a rescue hint's: seconds until its lease runs out

    def forwarded(self, skip: int) -> str:
        """The payload that hands this wake-up on to the peers from `skip` on."""
        body: dict[str, Any] = {"id": self.job_id, "n": self.count, "skip": skip}
        body["hops"] = self.hops + 1
        if self.queue is not None and self.handler is not None:
            body["q"], body["h"] = self.queue, self.handler
        return json.dumps(body, separators=(",", ":"))


ANY = Wake("any")


def _int(value: Any, low: int, high: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return min(max(value, low), high)


def parse(payload: str) -> Wake:
    """A notification's payload, checked field by field: what is not understood is ANY."""
    try:
        body = json.loads(payload) if len(payload) <= 8000 else None
    except (ValueError, RecursionError):
        return ANY
    if not isinstance(body, dict):
        return ANY
    if body.get("registry") == "drain":
        return Wake("drain")
    if "rescue" in body:
        return _rescue(body)
    peer_id = body.get("id")
    if body.get("peer") in ("up", "down"):
        if not isinstance(peer_id, str) or not peer_id:
            return ANY
        # The queues, handlers and slots an "up" carries (for daemons before this
        # change) are not read: the registry says what a peer serves.
        return Wake(str(body["peer"]), peer_id=peer_id)
    job_id = _int(peer_id, -(2**63), 2**63 - 1)
    count = _int(body.get("n"), 1, MAX_JOBS_PER_WAKE)
    if job_id is None or count is None:
        return ANY
    queue, handler = body.get("q"), body.get("h")
    if not (isinstance(queue, str) and isinstance(handler, str)):
        queue = handler = None  # names left out (too long): every handler's
    return Wake(
        "jobs",
        queue=queue,
        handler=handler,
        job_id=job_id,
        count=count,
        skip=_int(body.get("skip", 0), 0, MAX_PEERS) or 0,
        hops=_int(body.get("hops", 0), 0, 1000) or 0,
        next=_int(body.get("next"), 1, MAX_PEERS),
    )


def _rescue(body: dict[str, Any]) -> Wake:
    job_id = _int(body.get("rescue"), -(2**63), 2**63 - 1)
    queue, handler, holder = body.get("q"), body.get("h"), body.get("holder")
    expires_in = body.get("in")
    if (
        job_id is None
        or not all(isinstance(v, str) for v in (queue, handler, holder))
        or isinstance(expires_in, bool)
        or not isinstance(expires_in, int | float)
        or not 0 < expires_in < 86400 * 366
    ):
        return ANY
    return Wake(
        "rescue",
        queue=str(queue),
        handler=str(handler),
        job_id=job_id,
        holder=str(holder),
        expires_in=float(expires_in),
    )


def rescue_hint(job_id: int, queue: str, handler: str, holder: str, expires_in: float) -> str:
    body = {"rescue": job_id, "q": queue, "h": handler, "holder": holder, "in": expires_in}
    return json.dumps(body, separators=(",", ":"))


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _points(peer_id: str) -> list[int]:
    return [_point(f"{peer_id}#{v}") for v in range(VNODES)]


@dataclass
class _Ring:
    points: list[int] = field(default_factory=list)
    owners: list[Peer] = field(default_factory=list)
    size: int = 0  # distinct peers
    generation: int = -1  # of the peer list it was built from
    has_me: bool = False  # this daemon is on it


class Peers:
    """The live peers as the registry lists them (Presence reads it now and then, and
    sooner, rate-limited, when a notification says a peer came or went). Nothing else
    adds or removes a peer: anyone may NOTIFY, only daemons write the registry."""

    def __init__(
        self,
        me: str,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.me = me
        self.clock = clock
        self.timer = timer  # measures what building a ring cost
        self.members: dict[str, Peer] = {}
        self.loaded = False  # read from the registry at least once
        self._points: dict[str, list[int]] = {}  # a peer's VNODES points, kept while listed
        self._rings: dict[tuple[str | None, str | None], _Ring] = {}
        self._generation = 0
        self._budget = RING_BUDGET_BURST  # seconds of ring work allowed now
        self._budget_at = clock()

    def __len__(self) -> int:
        return len(self.members)

    def replace(self, peers: list[Peer]) -> None:
        """The registry's live rows, just read."""
        members = {p.id: p for p in peers[:MAX_PEERS]}
        if members == self.members and self.loaded:
            return  # nothing changed: the rings stay
        self.members = members
        self.loaded = True
        self._generation += 1
        self._points = {i: self._points.get(i) or _points(i) for i in members}

    def serving(self, queue: str | None, handler: str | None) -> int:
        ring = self._ring(queue, handler)
        return 0 if ring is None else ring.size

    def _may_spend(self) -> bool:
        now = self.clock()
        self._budget = min(
            RING_BUDGET_BURST, self._budget + (now - self._budget_at) * RING_BUDGET_SHARE
        )
        self._budget_at = now
        return self._budget > 0

    def _ring(self, queue: str | None, handler: str | None) -> _Ring | None:
        """The ring of the peers serving (queue, handler); an older one, or None, when
        building it now would go over the budget."""
        ring = self._rings.get((queue, handler))
        if ring is not None and ring.generation == self._generation:
            return ring
        if not self._may_spend():
            return ring
        started = self.timer()
        pairs = sorted(
            (point, p.id, p)
            for p in self.members.values()
            if p.serves(queue, handler)
            for point in self._points[p.id]
        )
        ring = _Ring([x[0] for x in pairs], [x[2] for x in pairs])
        ring.size = len({x[1] for x in pairs})
        ring.generation = self._generation
        ring.has_me = any(x[1] == self.me for x in pairs)
        self._rings[(queue, handler)] = ring
        self._budget -= max(0.0, self.timer() - started)
        return ring

    def _walk(self, ring: _Ring, key: int, limit: int, exclude: str = "") -> list[Peer]:
        """The first `limit` distinct peers in ring order from `key` on."""
        if not ring.points:
            return []
        start = bisect.bisect_left(ring.points, _point(str(key)))
        want = min(limit, ring.size)
        seen: dict[str, Peer] = {}
        for i in range(len(ring.points)):
            peer = ring.owners[(start + i) % len(ring.points)]
            if peer.id != exclude and peer.id not in seen:
                seen[peer.id] = peer
                if len(seen) >= want:
                    break
        return list(seen.values())

    def group(self, wake: Wake) -> tuple[bool, int | None]:
        """Whether this daemon is among the peers `wake` is for, and where the next group
        starts on the ring (None: no peer after them). The group holds enough peers, by
        their slots, for wake.count jobs."""
        ring = self._ring(wake.queue, wake.handler)
        if ring is None or not ring.has_me or not self._may_spend():
            return True, None  # cannot tell whose it is (or not now): take it
        started = self.timer()
        # enough of the ring for the group (each peer has one slot at least) and one after
        order = self._walk(ring, wake.job_id, wake.skip + wake.count + 1)
        self._budget -= max(0.0, self.timer() - started)
        end, slots = wake.skip, 0
        while end < len(order) and slots < wake.count:
            slots += max(1, order[end].slots)
            end += 1
        mine = any(p.id == self.me for p in order[wake.skip : end])
        return mine, (end if end < len(order) else None)

    def rescue_rank(self, job_id: int, queue: str, handler: str, holder: str) -> int | None:
        """This daemon's place among the peers that may rescue the job (its holder left
        out): 0 wakes when its lease runs out, 1 shortly after, None leaves it to them
        (and to the poll)."""
        if holder == self.me:
            return None  # its own job: renewed here, or this daemon is not running
        ring = self._ring(queue, handler)
        if ring is None or not ring.has_me or not self._may_spend():
            return 0  # cannot tell whose it is (or not now): take it
        started = self.timer()
        order = self._walk(ring, job_id, RESCUERS, exclude=holder)
        self._budget -= max(0.0, self.timer() - started)
        ranks = [rank for rank, peer in enumerate(order) if peer.id == self.me]
        return ranks[0] if ranks else None
