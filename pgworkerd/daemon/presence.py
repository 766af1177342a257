"""How a daemon shows itself: its registry row (heartbeat, in-flight jobs, drain
requests read back), the live peers read from the registry, its STATUS= line and process title, the
systemd watchdog, and the metrics gauges (the queue-depth count on a thread of its own,
daemon.queuedepth).

Presence reads the daemon's lifecycle and its job table; what it learns from the database
(a drain requested through it) it only reports: `drain_requested`."""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from setproctitle import setproctitle

from pgworkerd.config import Config
from pgworkerd.daemon.admission import MemoryState
from pgworkerd.daemon.dblink import ESCALATE_AFTER, DatabaseLink
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.peers import FLEET_POLLERS, Peer, Peers
from pgworkerd.daemon.queuedepth import QueueDepthCounter
from pgworkerd.daemon.states import DaemonState, RegistryState
from pgworkerd.durations import format_duration
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.ops.systemd import Notifier
from pgworkerd.queue import registry
from pgworkerd.version import __version__

log = logging.getLogger("pgworkerd")

# The registry heartbeat: within a second of a change of state or in-flight jobs (and at
# once when `pgworkerd drain` notifies), otherwise every HEARTBEAT_IDLE: an idle fleet's
# registry costs a tenth of what a heartbeat every second did. Well inside the 60 s after
# which peers mark a daemon gone.
HEARTBEAT_IDLE = 10.0
# ... and every HEARTBEAT_BUSY while the daemon holds jobs: a daemon silent for twice the
# interval it recorded is shown as silent (migration 0021), so a killed host's running
# jobs are flagged within 2 x HEARTBEAT_BUSY (10 s), not after their lease (60 s by
# default, hours for long jobs). One statement per busy host every 5 s, whatever its
# number of jobs; 2 x 5 s leaves a loaded host 5 s of lateness before it is flagged.
HEARTBEAT_BUSY = 5.0
# The live peers are read from the registry this often (jittered); their up/down
# notifications bring a read forward in between (they are never read as peers).
PEERS_REFRESH = 60.0
PEERS_REFRESH_MAX = 1800.0
# A notification that a peer came or went (anyone may send one) brings the next read
# forward, to no sooner than this after the last one (times the fleet's size over
# FLEET_POLLERS, so the fleet reads about FLEET_POLLERS times per HINTED_REFRESH at most,
# however many such notifications arrive), jittered by up to HINT_JITTER.
HINTED_REFRESH = 2.0
HINT_JITTER = 2.0


@dataclass
class Lifecycle:
    """The daemon's own state, as Presence shows it (the loop changes it)."""

    state: DaemonState = DaemonState.STARTING
    reload_error: str = ""  # "" or why the last SIGHUP reload failed (shown in STATUS=)


class PresenceStatements(Protocol):
    """The database calls presence makes (daemon.statements.Statements; None: the call
    failed)."""

    @property
    def ok(self) -> bool: ...

    def register(
        self, info: registry.WorkerInfo, state: str, heartbeat_interval: float
    ) -> None: ...

    def deregister(self) -> None: ...

    def heartbeat(
        self,
        info: registry.WorkerInfo,
        state: str,
        job_ids: list[int],
        heartbeat_interval: float,
    ) -> registry.DrainRequest | None: ...

    def peers(self, stale_after: float) -> list[tuple[str, list[str], list[str], int]] | None: ...

    def wake_channel_set(self, listening: bool) -> bool | None: ...


class Presence:
    def __init__(
        self,
        config: Config,
        worker_id: str,
        lifecycle: Lifecycle,
        statements: PresenceStatements,
        link: DatabaseLink,
        table: JobTable,
        notifier: Notifier,
        metrics: NullMetrics,
        depth_counter: QueueDepthCounter,
        clock: Callable[[], float] = time.monotonic,
        *,
        peers: Peers | None = None,
        rng: random.Random | None = None,
        memory: Callable[[], MemoryState | None] = lambda: None,
    ) -> None:
        """`memory`: admission by memory's state now (daemon.admission), published per
        handler in the registry row; None without a budget."""
        self.config = config
        self.worker_id = worker_id
        self.lifecycle = lifecycle
        self.statements = statements
        self.link = link
        self.table = table
        self.notifier = notifier
        self.metrics = metrics
        self.depth_counter = depth_counter
        self.memory = memory
        self.clock = clock
        self.drain_requested = False  # through the database (pgworkerd drain): claim nothing
        # a hand-back requested through the database (pgworkerd drain --hand-back); the
        # loop acts on it (Daemon._follow_hand_back)
        self.hand_back: registry.HandBack | None = None
        self.heartbeat_at = 0.0
        self.watchdog_at = 0.0
        self._shown_status = ""  # the title and STATUS= last set
        self.peers = peers
        self.peers_at = 0.0
        self.peers_read_at = -PEERS_REFRESH_MAX  # the last registry read of the peers
        self.rng = rng if rng is not None else random.Random()
        self._sent: tuple[str, tuple[int, ...]] | None = None  # the last heartbeat's news
        # whether the row says this daemon listens on its own wake channel (None: unknown)
        self._wake_channel_said: bool | None = None

    def configure(self, config: Config) -> None:
        self.config = config

    def stop(self) -> None:
        """At exit: a queue-depth count still running is cancelled."""
        self.depth_counter.stop()

    def heartbeat_now(self) -> None:
        self.heartbeat_at = 0.0

    def peers_changed(self, now: float) -> None:
        """A notification says a peer came or went: read the registry soon (the peers
        are its rows, never the notification's word), at most once per hinted period."""
        fleet = len(self.peers) if self.peers is not None else 0
        gap = min(PEERS_REFRESH, HINTED_REFRESH * max(1.0, fleet / FLEET_POLLERS))
        soon = max(self.peers_read_at + gap, now) + self.rng.uniform(0.0, HINT_JITTER)
        self.peers_at = min(self.peers_at, soon)

    def drain_hinted(self) -> None:
        """A notification says a drain was requested: heartbeat as soon as the heartbeat's
        own spacing allows (it reads drain_requested), as after any change of state."""
        self._sent = None

    def stale_after(self) -> float:
        """Silent this long, a daemon is no peer (and is marked gone: StaleMarking)."""
        return max(registry.STALE_AFTER_SECONDS, 6 * self.config.worker.renew_interval)

    def _worker_info(self) -> registry.WorkerInfo:
        memory = self.memory()
        published = memory.published() if memory is not None else {}
        return registry.WorkerInfo(
            id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            queues=self.config.queues,
            handlers=list(self.config.handlers),
            slots=self.config.worker.slots,
            settings={
                name: {
                    "queues": list(h.queues) or None,
                    "slots": h.slots,
                    "max_running": h.max_running,
                    "max_running_per_key": h.max_running_per_key,
                    # schema 33: fair share and start rates as written ("20/m")
                    "fair": h.fair,
                    "rate": None if h.rate is None else str(h.rate),
                    "rate_per_key": None if h.rate_per_key is None else str(h.rate_per_key),
                    # admission by memory: its expectation, how formed, budget and free
                    # (explain's memory_admission; absent without a budget)
                    **({"memory": published[name]} if name in published else {}),
                }
                for name, h in self.config.handlers.items()
            },
        )

    def heartbeat_interval(self) -> float:
        """The most seconds this daemon lets pass before its next heartbeat, recorded with
        each one (what `explain` and `status` measure silence against)."""
        return HEARTBEAT_BUSY if len(self.table) else HEARTBEAT_IDLE

    def register(self) -> None:
        self._wake_channel_said = None  # a row registered anew has no channel
        self.statements.register(
            self._worker_info(), self.registry_state(), self.heartbeat_interval()
        )

    def deregister(self) -> None:
        if self.statements.ok:
            self.statements.deregister()

    def next_deadline(self) -> float | None:
        # No heartbeat while the link is down (the loop waits for the reconnect instead).
        times = [self._next_heartbeat(), self.peers_at] if self.statements.ok else []
        if self.notifier.watchdog_interval:
            times.append(self.watchdog_at)
        return min(times, default=None)

    def tick(self, now: float) -> None:
        self._heartbeat_if_due(now)
        self._report_status(now)

    def _news(self) -> tuple[str, tuple[int, ...]]:
        return (self.registry_state().value, tuple(sorted(self.table.ids())))

    def _next_heartbeat(self) -> float:
        """heartbeat_at is the earliest a heartbeat may go (a second after the last one);
        it goes then if there is news, else the interval it recorded after the last one
        (the news include the in-flight jobs, so that interval is still the one now)."""
        if self._sent is None or self._news() != self._sent:
            return self.heartbeat_at
        return self.heartbeat_at - self._min_interval() + self.heartbeat_interval()

    def _min_interval(self) -> float:
        return min(1.0, self.config.worker.renew_interval)

    def _heartbeat_if_due(self, now: float) -> None:
        if self.statements.ok and now >= self.peers_at:
            self._refresh_peers(now)
        if not self.statements.ok or now < self._next_heartbeat():
            return
        self.heartbeat_at = now + self._min_interval()
        self._sent = self._news()
        request = self.statements.heartbeat(
            self._worker_info(), self.registry_state(), self.table.ids(), self.heartbeat_interval()
        )
        if request is None and self.statements.ok:
            self.register()  # marked gone after a long outage: come back
            return
        if request is not None:
            self._drain_requested(request)
        if self.link.listen_due(now):
            self.link.listen(self.config.worker.poll_interval)
        self._say_wake_channel()
        if self.metrics.queue_depth_due():
            self.depth_counter.start()

    def _say_wake_channel(self) -> None:
        """Keep the row's wake_channel in step with the LISTEN connection, at the
        heartbeat's pace: the database aims wake-ups only at daemons whose row says they
        listen on their own channel (workers_wake, schema 40); the others hear the
        fleet's channel."""
        listening = self.link.own_channel is not None
        if listening == self._wake_channel_said:
            return
        said = self.statements.wake_channel_set(listening)
        if said is not None:
            self._wake_channel_said = listening if said else None

    def _drain_requested(self, request: registry.DrainRequest) -> None:
        # An unfiltered hand-back stops every claim, whatever drain_requested says.
        drain = request.drain or (request.hand_back is not None and request.hand_back.everything)
        if drain != self.drain_requested:
            self.drain_requested = drain
            log.info("drain %s through the database", "requested" if drain else "lifted")
        if request.hand_back != self.hand_back:
            hb = request.hand_back
            if hb is None:
                log.info("hand-back lifted through the database")
            else:
                log.info(
                    "hand-back requested through the database: grace %s, queues %s, handlers %s",
                    "each handler's stop_grace" if hb.grace is None else format_duration(hb.grace),
                    "all" if hb.queues is None else ", ".join(sorted(hb.queues)),
                    "all" if hb.handlers is None else ", ".join(sorted(hb.handlers)),
                )
            self.hand_back = hb

    def _refresh_peers(self, now: float) -> None:
        # The fleet reads the registry about FLEET_POLLERS times per PEERS_REFRESH in all
        # (each read is a row per daemon: per daemon every PEERS_REFRESH, a fleet of N
        # would read N x N rows); up/down notifications keep the lists current between.
        fleet = len(self.peers) if self.peers is not None else 0
        period = min(PEERS_REFRESH_MAX, PEERS_REFRESH * max(1.0, fleet / FLEET_POLLERS))
        self.peers_at = now + period * self.rng.uniform(0.8, 1.2)
        self.peers_read_at = now
        if self.peers is None:
            return
        rows = self.statements.peers(self.stale_after())
        if rows is not None:
            self.peers.replace(
                [Peer(i, frozenset(q), frozenset(h), max(1, s)) for i, q, h, s in rows]
            )

    def registry_state(self) -> RegistryState:
        state = self.lifecycle.state
        if state is DaemonState.RUNNING and self.drain_requested:
            return RegistryState.DRAINED if not len(self.table) else RegistryState.DRAINING
        return RegistryState(state.value)

    def status_text(self) -> str:
        text = self._state_text()
        error = self.lifecycle.reload_error
        return f"{text}; {error}" if error else text

    def _state_text(self) -> str:
        slots = self.config.worker.slots
        busy = len(self.table)
        if not self.link.ok:
            if self.link.schema_refusal:
                return f"database schema refused, retrying ({busy} jobs running)"
            too_long = self.link.unreachable_too_long
            since = f" for over {format_duration(ESCALATE_AFTER)}" if too_long else ""
            return f"database unreachable{since}, retrying ({busy} jobs running)"
        state = self.registry_state()
        if state is RegistryState.RUNNING:
            # ([worker] prefetch: jobs held ready beyond the slots are not busy slots)
            held = max(0, busy - slots)
            return f"running: {busy - held}/{slots} busy" + (f", {held} held" if held else "")
        if state in (RegistryState.DRAINING, RegistryState.STOPPING):
            return f"{state}: {busy} jobs left"
        return state.value

    def _report_status(self, now: float) -> None:
        state = self.lifecycle.state
        self.metrics.set_draining(self.drain_requested or state is not DaemonState.RUNNING)
        self.metrics.set_in_flight(len(self.table), self.config.worker.slots)
        status = self.status_text()
        if status != self._shown_status:
            # Only when it changed: with short jobs the loop ticks thousands of times a
            # second, mostly with the same busy count.
            self._shown_status = status
            setproctitle(f"pgworkerd: {status} [{self.worker_id}]")
            self.notifier.status(status)
        if self.notifier.watchdog_interval and now >= self.watchdog_at:
            # The loop ticked, and every database call in a tick is bounded. Ping while
            # the database answers or while we keep to the reconnect schedule: a daemon
            # riding out an outage is healthy (restarting it would kill its jobs).
            if self.link.ok or self.link.recently_tried(now):
                self.notifier.watchdog()
            self.watchdog_at = now + self.notifier.watchdog_interval
