"""The daemon's parent process: start-up, the loop, signals and the shutdown levels.

The parent is a set of components, each given what it needs when it is built:

- Supervisor: the fork server and the child processes (spawn, messages, reaping);
- DatabaseLink: the statement and LISTEN connections; Statements: the typed calls on it;
- JobTable: the jobs in flight, their children, their limits, their outcomes;
- Claimer: when and what to claim, dispatch, warm children;
- LeaseKeeper: lease renewals and progress saves;
- OutcomeWriter: outcomes kept until the database takes them;
- Presence: the registry row, STATUS=, the title, the watchdog, the gauges;
- Scheduler: the ticks of the config's periodic jobs (schedules);
- Retention: finished jobs past their retention deleted, one daemon of the fleet at a time;
- StaleMarking: daemons silent past stale_after marked gone, one daemon at a time.
- Sweep (EXPIRY): jobs past their expires_at ended as cancelled, served or not.
- Sweep (WAIT_TIMEOUTS): suspended jobs past their wait's timeout made pending again.
- RollupSweep: ended attempts counted per handler and minute or hour (the charts).

Each has `tick(now)` and `next_deadline()`. One loop turn is the list of verbs in _tick,
then one wait on a selector until the earliest deadline or a wake-up (a child's message,
a NOTIFY, a signal). Signal handlers only record the signal. Every database call is
bounded and a failing database never stops the loop: children keep running, outcomes
wait in memory and are written (still fenced by the lease token) when it is back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import selectors
import signal
import time
from collections import deque
from typing import Any

import psycopg
from setproctitle import setproctitle

from pgworkerd.backoff import Backoff
from pgworkerd.config import Config, ConfigError, file_warnings, load_config
from pgworkerd.daemon.accounting import UsageWriter
from pgworkerd.daemon.admission import HISTORY, HISTORY_JOBS, PERCENTILE, MemoryAdmission
from pgworkerd.daemon.cgroups import JobCgroups
from pgworkerd.daemon.claimer import Claimer
from pgworkerd.daemon.dblink import MAX_RECONNECT_DELAY, RECONNECT_INITIAL, DatabaseLink
from pgworkerd.daemon.hints import WakeHints
from pgworkerd.daemon.joblogs import JobLogs
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.leases import LeaseKeeper
from pgworkerd.daemon.outcomes import Outcome, OutcomeWriter
from pgworkerd.daemon.peers import Peers
from pgworkerd.daemon.presence import Lifecycle, Presence
from pgworkerd.daemon.queuedepth import QueueDepthCounter
from pgworkerd.daemon.retention import Retention, RollupSweep, StaleMarking
from pgworkerd.daemon.scheduler import Scheduler
from pgworkerd.daemon.statements import Statements
from pgworkerd.daemon.states import DaemonState, OutcomeKind, StopReason
from pgworkerd.daemon.supervisor import Child, Supervisor
from pgworkerd.daemon.sweeps import EXPIRY, WAIT_TIMEOUTS, Sweep
from pgworkerd.durations import format_duration
from pgworkerd.exitcodes import ExitCode
from pgworkerd.ops import logs, metrics
from pgworkerd.ops.systemd import Notifier
from pgworkerd.queue.db import DatabaseError, InvalidDsn, scrub
from pgworkerd.queue.migrate import SchemaError, check_current
from pgworkerd.queue.registry import HandBack
from pgworkerd.version import __version__
from pgworkerd.worker import identity
from pgworkerd.worker.forkserver import set_child_subreaper
from pgworkerd.worker.protocol import ChildMessage

log = logging.getLogger("pgworkerd")

# The loop wakes at least this often, whatever the deadlines say.
MAX_WAIT = 1.0
# While a claim's answer is on its way, children are served for at most this long
# (seconds); a claim slower than that is then waited for (the loop's other work, signals
# among it, waits as it always did during a claim).
SERVE_WHILE_CLAIMING = MAX_WAIT


def child_settings(config: Config) -> dict[str, Any]:
    """What the fork server hands every child it starts."""
    settings: dict[str, Any] = {
        "max_jobs_per_child": config.worker.max_jobs_per_child,
        "capture_logs": config.logs.capture,
    }
    if config.tracing.enabled:  # (pgworkerd.tracing: each child builds its provider)
        settings["tracing"] = {
            "provider": config.tracing.provider,
            "attempt_parent": config.tracing.attempt_parent,
        }
    return settings


def forkserver_modules(config: Config) -> list[str]:
    """What the fork server preloads: the handlers' modules, and with [tracing] enabled
    pgworkerd.tracing and the provider's module (a child then imports none of it)."""
    modules = {h.module for h in config.handlers.values()}
    if config.tracing.enabled:
        modules.add("pgworkerd.tracing")
        if config.tracing.provider:
            modules.add(config.tracing.provider.partition(":")[0])
    return sorted(modules)


def daemon_spans(config: Config, worker_id: str) -> Any:
    """The daemon's tracing.DaemonSpans, None with [tracing] off (nothing imported);
    raises RuntimeError when the provider cannot be built."""
    if not config.tracing.enabled:
        return None
    from pgworkerd import tracing

    return tracing.DaemonSpans(tracing.build_provider(config.tracing.provider), worker_id)


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        dsn: str | None = None,
        schema: str | None = None,
        config_path: str | None = None,
        job_cgroups: JobCgroups | None = None,
    ) -> None:
        # self.config is the file's; --dsn and --schema from the command line override it.
        self.config = config
        self.config_path = config_path
        self.dsn = config.database.dsn if dsn is None else dsn
        self.schema = config.database.schema if schema is None else schema
        self.worker_id = f"{config.worker_name()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.lifecycle = Lifecycle()
        self.exit_code = ExitCode.OK
        self.signals: deque[int] = deque()
        self.drain_deadline: float | None = None
        self.hand_back: HandBack | None = None  # the hand-back request acted on
        self.exit_deadline: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.selector = selectors.DefaultSelector()
        self.notifier = Notifier()
        self.metrics = metrics.create(
            config.metrics, queues=config.queues, handlers=config.handlers
        )

        self.link = DatabaseLink(
            config.database, self.dsn, self.schema, self.selector, worker_id=self.worker_id
        )
        # [tracing] (pgworkerd.tracing): the spans of claims and outcome writes; a provider
        # that cannot be built stops the start (run) with its reason
        self.tracing_error = ""
        try:
            self.spans = daemon_spans(config, self.worker_id)
        except RuntimeError as exc:
            self.spans, self.tracing_error = None, str(exc)
        self.statements = Statements(
            self.link, self.worker_id, self.schema, self.metrics, spans=self.spans
        )
        self.supervisor = Supervisor(
            self.selector,
            self._on_message,
            self._on_child_exit,
            job_uids=config.worker.job_uids,
            job_cgroups=job_cgroups,
        )
        self.statements.while_claiming = self._serve_while_claiming
        # what jobs print (daemon.joblogs)
        self.joblogs = JobLogs(
            config.logs,
            self.statements.write_logs,
            lambda: self.link.ok,
            lambda: self.supervisor.containment.tmp_root,
        )
        self.table = JobTable(
            config.worker, self.supervisor, self.metrics, self._settled, logs=self.joblogs
        )
        self.peers = Peers(self.worker_id)  # the live daemons, for targeted wake-ups
        # what attempts cost, written once their outcomes are (daemon.accounting)
        self.usage = UsageWriter(self.statements.write_usage, lambda: self.link.ok)
        self.writer = OutcomeWriter(
            self.statements.write_outcomes,
            lambda: self.link.ok,
            lambda when: self.claimer.request_at(when),
            on_written=self._outcomes_written,
            hold_completions=lambda: self.claimer.claiming_soon(),
        )
        # admission by measured memory ([worker] memory_budget; daemon.admission)
        self.admission = MemoryAdmission(
            config,
            lambda handlers: self.statements.memory_peaks(
                handlers, percentile=PERCENTILE, last=HISTORY, jobs=HISTORY_JOBS
            ),
        )
        self.claimer = Claimer(
            config,
            self.statements,
            self.table,
            self.supervisor,
            self.metrics,
            peers=self.peers,
            listening=lambda: self.link.listening,
            writer=self.writer,
            admission=self.admission,
        )
        # wake-ups sent while no LISTEN connection was in place were lost: claim once
        # when one is (again), rather than wait for the poll
        self.link.on_listening = self.claimer.request
        self.leases = LeaseKeeper(
            self.statements, self.table, self.metrics, config.worker.renew_interval
        )
        self.scheduler = Scheduler(config, self.statements)  # periodic jobs
        self.retention = Retention(config.retention, self.statements.prune_finished)
        self.presence = Presence(
            config,
            self.worker_id,
            self.lifecycle,
            self.statements,
            self.link,
            self.table,
            self.notifier,
            self.metrics,
            QueueDepthCounter(
                self.link, self.schema, self.metrics, config.metrics.queue_depth_interval
            ),
            peers=self.peers,
            memory=lambda: self.admission.state(self.table.busy_per_handler()),
        )
        self.stale_marking = StaleMarking(
            self.statements.mark_stale, self.presence.stale_after, lambda: len(self.peers)
        )
        # jobs past their expires_at end; suspended jobs past their timeout become pending
        self.expiry = Sweep(EXPIRY, self.statements.expired_cancel, lambda: len(self.peers))
        self.wait_timeouts = Sweep(
            WAIT_TIMEOUTS, self.statements.waits_expire, lambda: len(self.peers)
        )
        # the charts' rollup of ended attempts (the dashboard's charts)
        self.rollup = RollupSweep(self.statements.rollup_attempts, lambda: len(self.peers))
        # what the wake channel's notifications may cause (any role may NOTIFY)
        self.hints = WakeHints(
            self.claimer, self.presence.peers_changed, self.presence.drain_hinted
        )

    @property
    def state(self) -> DaemonState:
        return self.lifecycle.state

    # -- start-up ----------------------------------------------------------------------

    def run(self) -> int:
        """Run until drained or terminated; returns the process exit code."""
        # The CLI already masked a --dsn password in argv (pgworkerd.earlytitle); from
        # here on the title says what the daemon does, as it will once running.
        setproctitle(f"pgworkerd: starting [{self.worker_id}]")
        set_child_subreaper()
        # Not dumpable: a job of the daemon's own uid may not open the daemon's /proc
        # files (its descriptors: its log, its database sockets; its memory, with the
        # DSN) nor ptrace it; root still may (py-spy, gdb as root).
        identity.set_dumpable(False)
        if self.tracing_error:
            log.error("%s", self.tracing_error)
            return ExitCode.CONFIG
        # The fork server first: it must come from a process with no connections.
        modules = forkserver_modules(self.config)
        try:
            self.supervisor.start_forkserver(modules, child_settings(self.config))
        except RuntimeError as exc:
            log.error("%s", exc)
            return ExitCode.HANDLER
        self._install_signals()
        try:
            try:
                self.metrics.start()
            except ConfigError as exc:
                log.error("%s", exc)
                return ExitCode.CONFIG
            if not self._start_database():
                return self.exit_code
            self.lifecycle.state = DaemonState.RUNNING
            self.presence.register()
            self.metrics.set_worker(self.worker_id, __version__)
            self.link.listen(self.config.worker.poll_interval)
            log.info(
                "pgworkerd %s running as %s: %d slots, queues %s, handlers %s",
                __version__,
                self.worker_id,
                self.config.worker.slots,
                ", ".join(self.config.queues),
                ", ".join(self.config.handlers) or "none",
            )
            self.notifier.ready(self.presence.status_text())
            self._loop()
        finally:
            self._shutdown_processes()
        return self.exit_code

    def _start_database(self) -> bool:
        """Wait for the database (bounded per try, retried with backoff) and check the
        schema. A missing or mismatched schema is fatal: retrying cannot fix it."""
        backoff = Backoff(RECONNECT_INITIAL, MAX_RECONNECT_DELAY)
        while True:
            self._handle_signals()
            if self.state.leaving:
                return False
            try:
                conn = self.link.connect()
                check_current(conn, self.schema)
                self.link.attach(conn)
                return True
            except SchemaError as exc:
                log.error("%s", exc)
                self.exit_code = ExitCode.SCHEMA
                return False
            except InvalidDsn as exc:
                log.error("%s", exc)
                self.exit_code = ExitCode.CONFIG
                return False
            except (psycopg.Error, DatabaseError, OSError) as exc:
                message = scrub(
                    str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__,
                    self.dsn,
                )
                delay = backoff.next_delay()
                log.warning("database unreachable (%s); retrying in %.1fs", message, delay)
                self.notifier.status("database unreachable, retrying")
                setproctitle(f"pgworkerd: database unreachable, retrying [{self.worker_id}]")
                # Not READY yet: keep systemd's start timeout from killing a daemon that
                # is only waiting for its database.
                self.notifier.extend_timeout(delay + self.config.database.connect_timeout + 5)
                self._sleep(delay)

    def _install_signals(self) -> None:
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._record_signal)
        self.selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))

    def _record_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)  # only record: the loop acts on it

    # -- the loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._tick(time.monotonic())
            if self._finished():
                return
            self._wait()

    def _tick(self, now: float) -> None:
        self._handle_signals()
        self.supervisor.reap()
        self.supervisor.tick(now)  # a dead fork server comes back on its own schedule
        self._drain_timeout(now)
        self.table.tick(now, can_start=self.supervisor.can_start())
        # Jobs held ready ([worker] prefetch) go to the children that freed before this
        # turn's database work: a claim or a write blocks the loop for a round trip and a
        # commit, which children of short jobs would otherwise spend idle.
        self.table.dispatch()
        if self.link.reconnect_if_due():
            self._database_restored()
        self.leases.tick(now)
        self.admission.tick(now)  # the handlers' recent peaks, before the claim uses them
        memory = (
            self.admission.state(self.table.busy_per_handler()) if self.metrics.enabled else None
        )
        if memory is not None:
            self.metrics.set_memory(
                memory.budget,
                memory.held,
                {name: h.expected for name, h in memory.handlers.items()},
                {name: h.refused_slots for name, h in memory.handlers.items()},
            )
        self.claimer.set_accepting(self._accepting())
        # Claim and hand out before the registry heartbeat: a woken idle daemon starts
        # the job first (latency) and does its bookkeeping after. The writer owns the
        # order of outcomes and claim (OutcomeWriter.write_then_claim states the rule).
        self.writer.write_then_claim(now, self.claimer.tick)
        self.usage.tick(now)
        self.joblogs.tick(now)
        self.presence.tick(now)
        self._follow_hand_back()
        self.scheduler.tick(now)
        self.retention.tick(now)
        self.stale_marking.tick(now)  # after presence.tick: the live peers just read
        self.expiry.tick(now)
        self.rollup.tick(now)
        self.wait_timeouts.tick(now)
        self.claimer.set_accepting(self._accepting())  # a drain requested just now

    def _follow_hand_back(self) -> None:
        """Act on a hand-back request the registry heartbeat brought (or its lifting):
        claim none of the jobs it targets, ask their handlers to stop, and hand them
        back at the end of the grace (JobTable.hand_back). The released jobs' peers are
        woken by the release itself (job_release)."""
        request = self.presence.hand_back
        if request == self.hand_back:
            return
        self.hand_back = request
        self.claimer.hold_back(request)
        if request is None:
            self.table.lift_hand_back()
            return
        targeted = [j for j in self.table if request.targets(j.job.queue, j.job.handler)]
        log.info("handing back %d job(s)", len(targeted))
        for job in targeted:
            grace = request.grace
            if grace is None:
                grace = self.config.stop_grace_for(job.handler)
            self.table.hand_back(job, grace)

    def _accepting(self) -> bool:
        return (
            self.state is DaemonState.RUNNING and not self.presence.drain_requested and self.link.ok
        )

    def _database_restored(self) -> None:
        self.leases.renew_now()
        self.presence.heartbeat_now()
        self.claimer.request()
        self.scheduler.redeclare()
        self.link.listen(self.config.worker.poll_interval)

    def _outcomes_written(self, batch: list[Outcome]) -> None:
        # (fenced ones too: their history row exists as well)
        self.usage.add([o.usage for o in batch if o.usage is not None])

    def _settled(self, outcome: Outcome) -> None:
        """A job left the table: its outcome goes to the writer, its slot to the claimer."""
        self.writer.add(outcome)
        self.claimer.slot_freed()
        if outcome.kind is OutcomeKind.COMPLETE and getattr(outcome.job, "has_children", False):
            # (schema 27) the claim carries the completion: the trigger that releases the
            # children runs in its transaction, and the claim that follows takes them
            self.claimer.request()

    def _drain_timeout(self, now: float) -> None:
        if self.drain_deadline is not None and now >= self.drain_deadline:
            if len(self.table):
                log.info("drain timeout reached: stopping %d job(s)", len(self.table))
                self.table.stop_all(StopReason.DRAIN)
            self.drain_deadline = None

    def _finished(self) -> bool:
        if not self.state.leaving:
            return False
        if not self.table.busy() and not self.writer.pending:
            self.usage.flush()
            self.joblogs.flush()
            self.presence.deregister()
            return True
        if self.exit_deadline is not None and time.monotonic() >= self.exit_deadline:
            if self.writer.pending:
                log.error(
                    "exiting with %d outcome(s) unwritten (database unreachable); "
                    "those jobs will run again when their leases expire",
                    len(self.writer.pending),
                )
            self.presence.deregister()
            return True
        return False

    def _next_deadline(self) -> float:
        can_start = self.supervisor.can_start()
        candidates = [
            time.monotonic() + MAX_WAIT,
            self.table.next_deadline(can_start),
            self.claimer.next_deadline(),
            self.leases.next_deadline(),
            self.writer.next_deadline(),
            self.usage.next_deadline(),
            self.joblogs.next_deadline(),
            self.presence.next_deadline(),
            self.scheduler.next_deadline(),
            self.retention.next_deadline(),
            self.stale_marking.next_deadline(),
            self.expiry.next_deadline(),
            self.rollup.next_deadline(),
            self.wait_timeouts.next_deadline(),
            self.admission.next_deadline(),
            self.supervisor.next_deadline(),
            self.link.next_deadline(),
            self.drain_deadline,
        ]
        return min(t for t in candidates if t is not None)

    def _wait(self) -> None:
        if self.signals:
            return
        timeout = max(0.0, self._next_deadline() - time.monotonic())
        self.supervisor.flush_writes()  # (and watches for writability where some is left)
        for key, events in self.selector.select(timeout):
            kind, obj = key.data
            if events & selectors.EVENT_WRITE:  # a child's socket or its watcher's drained
                self.supervisor.flush_writes(obj)
                if kind == "watch" or not events & selectors.EVENT_READ:
                    continue
            if kind == "wake":
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            elif kind == "child":
                self.supervisor.readable(obj)
            elif kind == "listen":
                self._on_notifications(self.link.notifications())

    def _on_notifications(self, notifications: list[tuple[bool, str]]) -> None:
        """The wake channels, the fleet's and this daemon's own (see peers.py): hints,
        bounded by daemon/hints.py."""
        self.hints.receive(notifications, time.monotonic())

    def _sleep(self, seconds: float) -> None:
        """Wait that still wakes for signals (start-up only: no children yet)."""
        end = time.monotonic() + seconds
        while not self.signals and time.monotonic() < end:
            self.selector.select(max(0.0, end - time.monotonic()))
            try:
                while os.read(self._wake_r, 512):
                    pass
            except (BlockingIOError, OSError):
                pass

    # -- children ------------------------------------------------------------------------

    def _serve_while_claiming(self, fd: int) -> None:
        """While a claim's answer is on its way (`fd` readable: it has come): read what
        children say and hand held jobs ([worker] prefetch) to those that freed, rather
        than leave them idle for the round trip and the commit. Nothing here touches the
        database; a failure is logged and the claim is waited for as before."""
        try:
            self.supervisor.serve_until(fd, SERVE_WHILE_CLAIMING, self.table.dispatch)
        except Exception:
            log.exception("serving children while a claim runs failed; waiting for it")

    def _on_message(self, child: Child, message: ChildMessage) -> None:
        self.table.on_message(child, message)

    def _on_child_exit(self, child: Child, status: int) -> None:
        self.table.on_exit(child, status)
        self.claimer.slot_freed()

    # -- signals and shutdown levels ---------------------------------------------------

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.popleft()
            if sig in (signal.SIGTERM, signal.SIGINT):
                if self.state is DaemonState.DRAINING:
                    self.terminate(f"second {signal.Signals(sig).name}")
                elif self.state is not DaemonState.STOPPING:
                    self.drain(f"{signal.Signals(sig).name} received")
            elif sig == signal.SIGHUP:
                self.reload()

    def drain(self, why: str) -> None:
        """Stop claiming; let jobs finish until the drain timeout, then stop them."""
        w = self.config.worker
        log.info(
            "draining (%s): %d job(s) in flight, drain timeout %s",
            why,
            len(self.table),
            format_duration(w.drain_timeout),
        )
        self.lifecycle.state = DaemonState.DRAINING
        now = time.monotonic()
        self.drain_deadline = now + w.drain_timeout
        self.exit_deadline = now + w.drain_timeout + w.kill_grace + 30.0
        self.notifier.stopping(self.presence.status_text())
        # Keep systemd's stop timeout from killing jobs still inside the drain timeout.
        self.notifier.extend_timeout(w.drain_timeout + w.kill_grace + 30.0)
        self.claimer.set_accepting(False)
        for child in self.supervisor.idle():
            self.supervisor.retire(child)
        self.table.drain()

    def terminate(self, why: str) -> None:
        """Stop every child now; their jobs are released."""
        log.info("terminating (%s): stopping %d job(s)", why, len(self.table))
        if self.state is not DaemonState.DRAINING:
            self.drain(why)
        self.lifecycle.state = DaemonState.STOPPING
        self.table.stop_all(StopReason.TERMINATE)

    def reload(self) -> None:
        """SIGHUP: new handlers, slots and queues; in-flight jobs keep running as they were.

        An invalid config keeps the old one, and says so where `systemctl status` looks:
        STATUS= carries "reload failed: ..." until a reload succeeds. (The units'
        ExecReload= runs `check-config` first, so `systemctl reload` itself fails too.)"""
        if self.config_path is None:
            log.warning("SIGHUP ignored: no config file to reload")
            return
        self.notifier.reloading()
        try:
            new = load_config(self.config_path)
            if new.database != self.config.database:
                log.warning(
                    "reload: [database] changed in %s; it applies after a restart", self.config_path
                )
                new = dataclasses.replace(new, database=self.config.database)
            if new.worker.job_uids != self.config.worker.job_uids:
                log.warning(
                    "reload: worker.job_uids changed in %s; it applies after a restart",
                    self.config_path,
                )
                worker = dataclasses.replace(new.worker, job_uids=self.config.worker.job_uids)
                new = dataclasses.replace(new, worker=worker)
            if new.worker.job_cgroups != self.config.worker.job_cgroups:
                log.warning(
                    "reload: worker.job_cgroups changed in %s; it applies after a restart",
                    self.config_path,
                )
                worker = dataclasses.replace(new.worker, job_cgroups=self.config.worker.job_cgroups)
                new = dataclasses.replace(new, worker=worker)
            if new.tracing != self.config.tracing:
                log.warning(
                    "reload: [tracing] changed in %s; it applies after a restart", self.config_path
                )
                new = dataclasses.replace(new, tracing=self.config.tracing)
            modules = forkserver_modules(new)
            self.supervisor.start_forkserver(modules, child_settings(new))
        except (ConfigError, RuntimeError, OSError) as exc:
            log.error("reload failed, keeping the old config: %s", exc)
            # One line: STATUS= is one assignment of a newline-separated message.
            self.lifecycle.reload_error = f"reload failed: {logs.escape(str(exc))}"
            self.notifier.ready(self.presence.status_text())
            return
        for warning in file_warnings(new):
            log.warning("%s", warning)
        self.config = new
        self.lifecycle.reload_error = ""
        self.table.configure(new.worker)
        self.joblogs.configure(new.logs)
        self.admission.configure(new)
        self.claimer.configure(new)
        self.presence.configure(new)
        self.scheduler.configure(new)
        self.retention.configure(new.retention)
        self.leases.configure(new.worker.renew_interval)
        log.info(
            "reloaded %s: %d slots, queues %s, handlers %s",
            self.config_path,
            new.worker.slots,
            ", ".join(new.queues),
            ", ".join(new.handlers),
        )
        self.notifier.ready(self.presence.status_text())

    def _shutdown_processes(self) -> None:
        self.presence.stop()
        self.metrics.stop()
        self.supervisor.signal_all(signal.SIGKILL)
        self.supervisor.stop_forkserver()
        self.supervisor.close()
        self.link.close()
        if self.spans is not None:
            self.spans.shutdown()  # what is still queued is exported


def run_daemon(
    config: Config,
    *,
    dsn: str | None = None,
    schema: str | None = None,
    config_path: str | None = None,
    job_cgroups: JobCgroups | None = None,
) -> int:
    try:
        return Daemon(
            config, dsn=dsn, schema=schema, config_path=config_path, job_cgroups=job_cgroups
        ).run()
    except Exception as exc:
        # The traceback goes through the log formatter: masked, each line escaped.
        summary = scrub(f"{type(exc).__name__}: {exc}", dsn)
        log.critical("daemon crashed: %s", summary, exc_info=True)
        return ExitCode.FAILURE
