"""What the daemon claims, and when: free slots per handler in one statement, the wake-up
for the next scheduled job, coalesced NOTIFY wake-ups, and the warm children that claimed
jobs go to.

A claim is wanted when something says so through request() / request_at() / notified(),
when a wake-up names jobs this daemon is chosen for (woken(), see peers.py: one daemon per
batch of new jobs, not the whole fleet), when the poll interval passes, or when a slot
frees while the last claim filled every slot (a backlog). The claimer claims only while
accepting (the daemon runs, no drain is requested, the database is up) and while a child
can be started for what it claims. A wake-up it is chosen for but cannot take (no free
slot, draining) is forwarded to the next daemons on the ring.

After a claim that leaves slots free it looks up what comes next, in one statement: the
earliest scheduled job, and the running job whose lease runs out first. If this daemon is
the first (or second) of the peers for that job (its rescuers), it wakes when the lease
runs out; if not, and the lease was not renewed on time (less than lease - 2 x
renew_interval left: its holder missed a renewal), it sends the rescuers a hint so they
wake then. So a dead host's jobs run again within about a second of their lease, without
more polling: healthy leases send no hints.

While LISTEN works, the poll is only the fallback for wake-ups nobody took (a chosen
daemon that died, a lost notification) and the look-ahead above, and the fleet shares
it: each daemon polls every poll_interval x (its peers / FLEET_POLLERS), jittered, so the
fleet as a whole polls about FLEET_POLLERS times per poll_interval whatever its size.
Without LISTEN every daemon polls every poll_interval, as always.

A claim carries the completions the outcome writer holds (finished jobs not yet written):
both in one transaction, completions first, so a busy daemon pays one commit (a WAL flush:
claims and finishes are durable) per claim rather than two. If that transaction fails,
neither happened: the writer writes the completions alone, and the claim runs again.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol

from pgworkerd.config import Config
from pgworkerd.daemon.admission import MemoryAdmission
from pgworkerd.daemon.children import ChildSupervisor, ChildT
from pgworkerd.daemon.hints import RateLimit
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.outcomes import Outcome, OutcomeWriter
from pgworkerd.daemon.peers import FLEET_POLLERS, Peers, Wake, rescue_hint
from pgworkerd.ops.logs import JOB_EVENTS
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import ClaimedJob, HandlerCapacity, NextWakeups, RefusedJob
from pgworkerd.queue.registry import HandBack

log = logging.getLogger("pgworkerd")
job_events = logging.getLogger(JOB_EVENTS)  # claimed: [logging] job_events

# Claims caused by NOTIFY are at most this frequent: any role may NOTIFY the channel, and
# a flood of notifications must not become a flood of claims (20 ms: at most 50 a second,
# while a single enqueue into an idle daemon still starts at once).
NOTIFY_CLAIM_INTERVAL = 0.02
# A wake-up is forwarded at most this many times before the last daemon keeps it (claims
# when a slot frees): a fleet that is full everywhere does not pass it round and round.
MAX_FORWARDS = 2
# The first rescuer claims this long after the lease ran out (the server's clock and the
# claim's own now() must agree that it did), the second this long after the first.
RESCUE_MARGIN = 0.05
RESCUE_SECOND = 0.5
# However large the fleet, a listening daemon polls at least this often.
MAX_POLL_PERIOD = 600.0
# Wake-ups handed on per second, in the long run and in a burst: each is a statement, and
# any role may send wake-ups naming this daemon's handlers while its slots are full.
# Beyond, one plain wake-up (every daemon claims once) goes at most every
# FORWARD_OVERFLOW_EVERY instead of the rest.
FORWARD_RATE = 20.0
FORWARD_BURST = 20.0
FORWARD_OVERFLOW_EVERY = 0.5
PLAIN_WAKE = "{}"


class ClaimStatements(Protocol):
    """The database calls the claimer makes (daemon.statements.Statements; None: the call
    failed)."""

    @property
    def ok(self) -> bool: ...

    def claim(
        self,
        queues: Sequence[str],
        capacity: dict[str, HandlerCapacity],
        limit: int,
        completions: Sequence[Outcome] = (),
    ) -> tuple[list[ClaimedJob], list[RefusedJob]] | None: ...

    def next_wakeups(
        self, queues: Sequence[str], handlers: Sequence[str]
    ) -> NextWakeups | None: ...

    def wake_send(self, payload: str) -> bool | None: ...

    def wake_forward(self, wake: Wake) -> bool | None: ...


class Claimer(Generic[ChildT]):
    def __init__(
        self,
        config: Config,
        statements: ClaimStatements,
        table: JobTable[ChildT],
        supervisor: ChildSupervisor[ChildT],
        metrics: NullMetrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        peers: Peers | None = None,
        listening: Callable[[], bool] = lambda: False,
        rng: random.Random | None = None,
        writer: OutcomeWriter | None = None,
        admission: MemoryAdmission | None = None,
    ) -> None:
        self.config = config
        # admission by measured memory: what fits of each handler (None or disabled: all)
        self.admission = admission
        # Finished jobs' completions waiting to be written ride along with a claim: one
        # transaction, one commit for both (a busy daemon's cost per job is mostly commits).
        self.writer = writer
        self.peers = peers
        self.listening = listening
        self.rng = rng if rng is not None else random.Random()
        # wake-ups to hand on, sent at the next tick: a payload for the fleet's channel, or
        # a Wake for workers_wake (skip and hops already those of the next group)
        self.forwards: list[str | Wake] = []
        self.forwarding = RateLimit(FORWARD_RATE, FORWARD_BURST, clock)
        self.forward_overflow = False  # some were not handed on: send a plain wake-up
        self.overflow_sent_at = -FORWARD_OVERFLOW_EVERY
        self.hint_at: float | None = None  # a rescue hint's claim: coalesced when due
        self.hinted: dict[int, str] = {}  # rescue hints sent: job id -> its holder
        self.woken_only = False  # the claim about to run is wanted only by a wake-up
        self.statements = statements
        self.table = table
        self.supervisor = supervisor
        self.metrics = metrics
        self.clock = clock
        self.accepting = False
        # a filtered hand-back in place (drain --hand-back --queue/--handler): its jobs are
        # not claimed here, the rest are (an unfiltered one stops accepting instead)
        self.held_back: HandBack | None = None
        self.wanted = True
        self.backlog = False  # the last claim filled every free slot: more may wait
        self.poll_at = 0.0
        self.scheduled_at: float | None = None  # earliest future run_at, or a retry
        self.notified_at: float | None = None  # a NOTIFY came and caused no claim yet
        self.notify_claim_at = 0.0  # the last claim a NOTIFY caused

    def configure(self, config: Config) -> None:
        """After a reload: new handlers, queues and slots, and claim with them at once."""
        self.config = config
        self.request()

    # -- why to claim --------------------------------------------------------------------

    def request(self) -> None:
        """Claim at the next tick."""
        self.wanted = True

    def request_at(self, when: float) -> None:
        """Claim at `when` (a failed job's retry, a scheduled job)."""
        self.scheduled_at = when if self.scheduled_at is None else min(self.scheduled_at, when)

    def notified(self, now: float) -> None:
        """A NOTIFY arrived: claim soon, but at most once per NOTIFY_CLAIM_INTERVAL."""
        self.notified_at = self.notified_at or now

    def woken(self, wake: Wake, now: float, *, aimed: bool = False) -> None:
        """New jobs (or jobs handed on by a peer): claim if they are this daemon's.
        `aimed`: it came on this daemon's own channel, where the database sends the
        wake-ups it chose this daemon for (workers_wake): this daemon's without ranking,
        and what it cannot take goes on to the next group through workers_wake again."""
        if wake.queue is not None and wake.handler is not None:
            handler = self.config.handlers.get(wake.handler)
            if handler is None or wake.queue not in self.config.queues:
                return  # not served here
        elif aimed:
            self.notified(now)  # workers_wake always names them: not one of its own
            return
        if aimed:
            mine, next_skip = True, wake.next
        elif self.peers is None:
            self.notified(now)
            return
        else:
            mine, next_skip = self.peers.group(wake)
        if not mine:
            return
        held = self.held_back is not None and self.held_back.targets(wake.queue, wake.handler)
        if not held and self._can_take(wake.handler):
            self.notified(now)
        elif next_skip is not None and wake.hops < MAX_FORWARDS:
            if self.forwarding.allow():
                self.forwards.append(
                    dataclasses.replace(wake, skip=next_skip, hops=wake.hops + 1)
                    if aimed
                    else wake.forwarded(next_skip)
                )
            else:
                self.forward_overflow = True
        else:
            self.request()  # nobody else to ask: claim here when a slot frees

    def _can_take(self, handler: str | None) -> bool:
        free = self.table.free_to_claim()
        if not self._may_claim() or free <= 0:
            return False
        if handler is None:
            return True
        capacity = self.capacity(free).get(handler)
        return capacity is not None and capacity.free > 0

    def slot_freed(self) -> None:
        # With a fleet-wide limit, a short claim says nothing about what waits: jobs may
        # be held back only by the limit, and the slot that just freed here may be the
        # fleet slot they wait for. So claim again, as with a backlog.
        # With admission by memory, a job that ends frees memory other handlers' jobs
        # may be waiting for: claim again too.
        if (
            self.backlog
            or self._admitting()
            or any(
                h.max_running is not None or h.max_running_per_key is not None
                for h in self.config.handlers.values()
            )
        ) and self._worth_a_claim():
            self.request()

    def _worth_a_claim(self) -> bool:
        """With [worker] prefetch, a claim waits until half of it is free, or nothing is
        left waiting for a slot: one claim a job would cost a round trip a job, while
        held jobs keep the children busy. Without, any free slot is."""
        prefetch = self.config.worker.prefetch
        return (
            prefetch == 0
            or self.table.free_to_claim() >= max(1, prefetch // 2)
            or not self.table.waiting()
        )

    def claiming_soon(self) -> bool:
        """Whether a claim that can carry completions is expected shortly: with [worker]
        prefetch and a backlog, a claim waits until half the prefetch is free, and jobs
        end meanwhile (their completions may wait for it: OutcomeWriter)."""
        return self.backlog and self.config.worker.prefetch > 0 and self._may_claim()

    def _admitting(self) -> bool:
        return self.admission is not None and self.admission.enabled

    def hold_back(self, hand_back: HandBack | None) -> None:
        """Claim none of the jobs a hand-back targets (None: claim them again)."""
        if hand_back is None and self.held_back is not None:
            self.request()
        self.held_back = hand_back

    def set_accepting(self, accepting: bool) -> None:
        if accepting and not self.accepting:
            self.request()
        self.accepting = accepting

    # -- the tick ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Claim if wanted, hand claimed jobs to idle children, keep warm children."""
        self._forward()
        self._claim_if_wanted(now)
        self.table.dispatch()
        self._keep_warm()

    def next_deadline(self) -> float | None:
        # Claim timers only matter with a free slot and something to claim for; past
        # ones would spin the loop.
        if not self._may_claim() or self.table.free_to_claim() <= 0 or not self.config.handlers:
            return None
        times = [self.poll_at]
        if self.scheduled_at is not None:
            times.append(self.scheduled_at)
        if self.hint_at is not None:
            times.append(self.hint_at)
        if self.notified_at is not None:
            times.append(self.notify_claim_at + NOTIFY_CLAIM_INTERVAL)
        return min(times)

    def _may_claim(self) -> bool:
        # A job claimed without a child to run it would only hold its lease while another
        # daemon could run it: no claims while no child can be started.
        return self.accepting and self.supervisor.can_start()

    def _forward(self) -> None:
        now = self.clock()
        if self.forward_overflow and now >= self.overflow_sent_at + FORWARD_OVERFLOW_EVERY:
            self.forward_overflow, self.overflow_sent_at = False, now
            self.forwards.append(PLAIN_WAKE)
        while self.forwards and self.statements.ok:
            forward = self.forwards.pop(0)
            if isinstance(forward, Wake):  # aimed at the next group (workers_wake)
                self.statements.wake_forward(forward)
            else:
                self.statements.wake_send(forward)

    def poll_period(self) -> float:
        """How long until the next poll (see the module's docstring)."""
        w = self.config.worker
        if self.peers is None or not self.listening():
            return w.poll_interval
        sharing = self._sharing()
        if sharing <= FLEET_POLLERS:
            return w.poll_interval
        longest = max(w.poll_interval, MAX_POLL_PERIOD)
        period = min(longest, w.poll_interval * sharing / FLEET_POLLERS)
        return period * self.rng.uniform(0.9, 1.1)

    def _sharing(self) -> int:
        """How many daemons share the poll of this daemon's least served pair of queue and
        handler: its jobs wait for their poll when a wake-up is lost (its daemon died
        before the registry says so), so the poll is stretched by those daemons, not by
        the fleet (2 of 1,000 daemons serving a handler poll every poll_interval, not 100
        times as seldom). 0 when the peers are not known (or not now): no stretch."""
        assert self.peers is not None
        if not self.peers.loaded:
            return 0
        fewest: int | None = None
        for name, h in self.config.handlers.items():
            for queue in h.queues or self.config.queues:
                serving = self.peers.serving(queue, name)
                fewest = serving if fewest is None else min(fewest, serving)
        return fewest or 0

    def _claim_if_wanted(self, now: float) -> None:
        if not self._may_claim():
            return
        if self.scheduled_at is not None and now >= self.scheduled_at:
            self.wanted, self.scheduled_at = True, None  # served: a failed claim must not
            # leave a past deadline behind (the loop would spin on it)
        if now >= self.poll_at:
            self.wanted = True
        if self.hint_at is not None and now >= self.hint_at:
            self.hint_at = None
            self.notified(now)  # a hint's claim is coalesced like a notification's
        woken_only = not self.wanted
        if self.notified_at is not None and now >= self.notify_claim_at + NOTIFY_CLAIM_INTERVAL:
            self.notified_at, self.notify_claim_at = None, now
            self.wanted = True
        free = self.table.free_to_claim()
        if not self.wanted or free <= 0 or not self.config.handlers:
            return
        self.wanted = False
        self.poll_at = now + self.poll_period()
        capacity = self.capacity(free)
        if not capacity:
            return  # every handler held back by a hand-back
        if self.admission is not None and self._admitting():
            # whatever mix of handlers the claim takes, it fits the memory budget
            free = min(
                free,
                self.admission.claim_cap(
                    [n for n, c in capacity.items() if c.free > 0], self.table.busy_per_handler()
                ),
            )
            if free <= 0:
                return  # nothing fits now: a job that ends asks again (slot_freed)
        sent_at = self.clock()
        carried = self.writer.completions() if self.writer is not None else []
        if carried:
            result = self.statements.claim(self.config.queues, capacity, free, carried)
        else:
            result = self.statements.claim(self.config.queues, capacity, free)
        if result is None:
            if carried:
                # Perhaps only a completion's value was refused: the writer tries each
                # alone, and the claim runs again at the next tick without them.
                self.request()
            return
        if carried and self.writer is not None:
            self.writer.carried(carried)
        claimed, refused = result
        # Every slot filled: more may wait, so claim again when one frees. Not when one
        # slot was free and a wake-up for one batch filled it: each batch of jobs wakes
        # its own daemon, and an empty claim per job would double the claims.
        self.backlog = len(claimed) + len(refused) == free and (free > 1 or not woken_only)
        for bad in refused:
            # Its row cannot be loaded: finished on its own, the rest of the claim runs.
            self.table.refuse(
                bad, self.config.handlers.get(bad.handler), f"cannot run: {bad.reason}"
            )
        for job in claimed:
            if self.table.has_job(job.id) or (
                self.writer is not None and self.writer.holds(job.id)
            ):
                # Only after the database lost acknowledged writes (a failover to an
                # asynchronous standby, or a crash of a server whose own claims were not
                # durable): our claim rolled back and we claimed the job again, under the
                # same lease token. One child per job: the running attempt stays, the new
                # lease is left to run out; an attempt that ended here but whose outcome
                # is not written yet keeps it (written under that token, it would
                # otherwise end the new attempt's lease while its child runs).
                log.warning(
                    "job %d %s: claimed again while its attempt runs here (the database lost "
                    "acknowledged writes); not starting it twice",
                    job.id,
                    job.handler,
                )
                continue
            self.metrics.claimed(job.handler, rescued=job.rescued)
            handler = self.config.handlers[job.handler]
            self.table.add(job, handler, self.config.lease_for(handler), sent_at)
            job_events.info(
                "job %d %s attempt %d: claimed%s",
                job.id,
                job.handler,
                job.attempt,
                " (rescued after its lease expired)" if job.rescued else "",
                extra={
                    "fields": {
                        "job_id": job.id,
                        "handler": job.handler,
                        "attempt": job.attempt,
                        "event": "claimed",
                    }
                },
            )
        self.table.dispatch()  # start them before the next lookup
        if not self.backlog:
            self._look_ahead()

    def _look_ahead(self) -> None:
        """Wake for the next scheduled job, and for the lease that runs out first if this
        daemon is one of its rescuers."""
        found = self.statements.next_wakeups(self.config.queues, list(self.config.handlers))
        if found is None:
            return
        now = self.clock()
        self.scheduled_at = None if found.run_in is None else now + max(0.0, found.run_in)
        job = found.expiring
        if job is None or job.handler not in self.config.handlers or job.expires_in <= 0:
            return  # expired already: the claim just made could not take it (a limit, a
            # pause, this handler's slots), and waking for it again would spin
        rank = self._rescue_at(job.id, job.queue, job.handler, job.holder, job.expires_in, now)
        lease = self.config.lease_for(self.config.handlers[job.handler])
        late = job.expires_in < lease - 2 * self.config.worker.renew_interval
        if rank != 0 and late and self.hinted.get(job.id) != job.holder:
            # its holder missed a renewal: tell the rescuers (once per job and holder)
            self.hinted[job.id] = job.holder
            while len(self.hinted) > 100:
                del self.hinted[next(iter(self.hinted))]
            self.forwards.append(
                rescue_hint(job.id, job.queue, job.handler, job.holder, job.expires_in)
            )

    def rescue_hinted(self, wake: Wake, now: float) -> None:
        """A peer saw a lease that was not renewed on time: wake for it if this daemon is
        one of its rescuers. Any role may NOTIFY: the claim it causes is coalesced with
        the notifications' (at most one per NOTIFY_CLAIM_INTERVAL), and the earliest
        hint wins."""
        if wake.handler not in self.config.handlers or wake.queue not in self.config.queues:
            return
        rank = (
            0
            if self.peers is None
            else self.peers.rescue_rank(wake.job_id, wake.queue, wake.handler, wake.holder)
        )
        if rank is not None:
            at = now + wake.expires_in + RESCUE_MARGIN + rank * RESCUE_SECOND
            self.hint_at = at if self.hint_at is None else min(self.hint_at, at)

    def _rescue_at(
        self, job_id: int, queue: str, handler: str, holder: str, expires_in: float, now: float
    ) -> int | None:
        """Wake when the lease runs out if this daemon is one of the job's rescuers;
        returns its rank (None: not one)."""
        rank = 0 if self.peers is None else self.peers.rescue_rank(job_id, queue, handler, holder)
        if rank is not None:
            self.request_at(now + expires_in + RESCUE_MARGIN + rank * RESCUE_SECOND)
        return rank

    def capacity(self, free: int) -> dict[str, HandlerCapacity]:
        """What each handler may claim now: the free slots, capped by its own slots. A
        filtered hand-back takes its queues from the handlers it targets (a handler left
        with none is not claimed for)."""
        busy = self.table.busy_per_handler()
        held = self.held_back
        capacity = {}
        for name, h in self.config.handlers.items():
            queues: Sequence[str] | None = h.queues or None
            if held is not None and (held.handlers is None or name in held.handlers):
                if held.queues is None:
                    continue  # every queue of it is held back
                queues = [q for q in (queues or self.config.queues) if q not in held.queues]
                if not queues:
                    continue
            fits = free if h.slots is None else min(free, h.slots - busy.get(name, 0))
            if self.admission is not None and self._admitting():
                fits = self.admission.offer(name, fits, busy)
            capacity[name] = HandlerCapacity(
                lease_seconds=self.config.lease_for(h),
                free=fits,
                max_attempts=h.max_attempts,
                queues=queues,
                max_running=h.max_running,
                max_running_per_key=h.max_running_per_key,
                fair=h.fair,
                weights=h.weights or None,
                rate=None if h.rate is None else h.rate.per_second,
                rate_per_key=None if h.rate_per_key is None else h.rate_per_key.per_second,
            )
        return capacity

    def _keep_warm(self) -> None:
        if not self.accepting:
            # Children that were still starting when a drain began come up idle: retire
            # them, or the daemon would wait for them until its exit deadline.
            for child in self.supervisor.idle():
                self.supervisor.retire(child)
            return
        # (jobs that a child running their async handler's jobs side by side can take
        # need no child of their own)
        waiting = max(0, self.table.slots_without_child() - self.table.room_beside())
        # (free_slots() is below 0 while prefetched jobs wait: then no warm child, but one
        # for each waiting job a slot is free for)
        target = min(self.config.worker.warm_children, max(0, self.table.free_slots())) + waiting
        have = len(self.supervisor.idle()) + self.supervisor.starting()
        if target > have:
            self.supervisor.spawn(target - have)  # one request for all of them
