"""The daemon's parent process: one loop that claims jobs, hands them to children,
renews their leases and records their outcomes.

The loop's tick is a fixed sequence (signals, children, limits, outcomes, leases,
registry, claim, dispatch, warm children, status) and then one wait on a selector until
the next deadline or wake-up. Signal handlers only record the signal. Every database call
is bounded (connect/statement timeouts, TCP keepalives) and a failing database never
stops the loop: children keep running, outcomes wait in memory and are written (still
fenced by the lease token) when the database is back.

Two roles live in mixins of their own: Claiming (claim, dispatch, warm children, the
scheduled wake-up) and Presence (registry, STATUS=, title, watchdog, gauges).
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
from dataclasses import dataclass
from typing import Any

import psycopg
from setproctitle import setproctitle

from pgworkerd import __version__
from pgworkerd.config import Config, ConfigError, file_warnings, load_config
from pgworkerd.daemon import outcomes
from pgworkerd.daemon.claiming import NOTIFY_CLAIM_INTERVAL, Claiming
from pgworkerd.daemon.dblink import MAX_RECONNECT_DELAY, DatabaseLink
from pgworkerd.daemon.outcomes import InFlight, Outcome, decide, fence_margin
from pgworkerd.daemon.presence import Presence, QueueDepthCounter
from pgworkerd.daemon.supervisor import Child, Supervisor, describe_exit
from pgworkerd.describe import short_error
from pgworkerd.durations import format_duration
from pgworkerd.exitcodes import ExitCode
from pgworkerd.ops import logs, metrics
from pgworkerd.ops.systemd import Notifier
from pgworkerd.queue.db import DatabaseError, InvalidDsn, scrub
from pgworkerd.queue.lease import Lease, encode_json, renew
from pgworkerd.queue.migrate import SchemaError, check_current
from pgworkerd.worker.forkserver import set_child_subreaper

log = logging.getLogger("pgworkerd")

# Progress and checkpoints reach the job row at most this often.
PROGRESS_SAVE_INTERVAL = 1.0
# An outcome whose write fails this often (with the database up) is dropped; the job's
# lease then expires and the claim rescues it.
MAX_OUTCOME_WRITES = 3


@dataclass
class Timers:
    renew_at: float = 0.0
    registry_at: float = 0.0
    poll_at: float = 0.0
    scheduled_at: float | None = None  # earliest future run_at among claimable jobs
    watchdog_at: float = 0.0
    progress_at: float = 0.0
    drain_deadline: float | None = None
    exit_deadline: float | None = None
    notified_at: float | None = None  # a NOTIFY arrived and has not caused a claim yet
    notify_claim_at: float = 0.0  # the last claim a NOTIFY caused


class Daemon(Claiming, Presence):
    def __init__(
        self,
        config: Config,
        *,
        dsn: str | None = None,
        schema: str | None = None,
        config_path: str | None = None,
    ) -> None:
        # self.config is the file's; --dsn and --schema from the command line override it.
        self.config = config
        self.config_path = config_path
        self.dsn = config.database.dsn if dsn is None else dsn
        self.schema = config.database.schema if schema is None else schema
        self.worker_id = f"{config.worker_name()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.state = "starting"
        self.reload_error = ""
        self.notifier = Notifier()
        self.selector = selectors.DefaultSelector()
        self.supervisor = Supervisor(self.selector, self._on_message, self._on_child_exit)
        self.in_flight: dict[int, InFlight] = {}
        self.outcomes: deque[Outcome] = deque()
        self.timers = Timers()
        self.db = DatabaseLink(config.database, self.dsn, self.schema, self.selector)
        self.signals: deque[int] = deque()
        self.claim_wanted = True
        self.backlog = False
        self.drain_requested_in_db = False
        self.exit_code = ExitCode.OK
        self._wake_r, self._wake_w = os.pipe()
        self.metrics = metrics.create(
            config.metrics, queues=config.queues, handlers=config.handlers
        )
        self.depth_counter = QueueDepthCounter(
            self.db, self.schema, self.metrics, config.metrics.queue_depth_interval
        )

    # -- start-up ----------------------------------------------------------------------

    def run(self) -> int:
        """Run until drained or terminated; returns the process exit code."""
        # The CLI already masked a --dsn password in argv (pgworkerd.earlytitle); from
        # here on the title says what the daemon does, as it will once running.
        setproctitle(f"pgworkerd: starting [{self.worker_id}]")
        set_child_subreaper()
        # The fork server first: it must come from a process with no connections.
        modules = sorted({h.module for h in self.config.handlers.values()})
        try:
            self.supervisor.start_forkserver(modules, self._child_settings())
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
            self.state = "running"
            self._register()
            self.metrics.set_worker(self.worker_id, __version__)
            self.db.listen(self.config.worker.poll_interval)
            log.info(
                "pgworkerd %s running as %s: %d slots, queues %s, handlers %s",
                __version__,
                self.worker_id,
                self.config.worker.slots,
                ", ".join(self.config.queues),
                ", ".join(self.config.handlers) or "none",
            )
            self.notifier.ready(self._status_text())
            self._loop()
        finally:
            self._shutdown_processes()
        return self.exit_code

    def _child_settings(self) -> dict[str, Any]:
        return {"max_jobs_per_child": self.config.worker.max_jobs_per_child}

    def _start_database(self) -> bool:
        """Wait for the database (bounded per try, retried with backoff) and check the
        schema. A missing or mismatched schema is fatal: retrying cannot fix it."""
        delay = 0.5
        while True:
            self._handle_signals()
            if self.state in ("draining", "stopping"):
                return False
            try:
                conn = self.db.connect()
                check_current(conn, self.schema)
                self.db.attach(conn)
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
                log.warning("database unreachable (%s); retrying in %.1fs", message, delay)
                self.notifier.status("database unreachable, retrying")
                setproctitle(f"pgworkerd: database unreachable, retrying [{self.worker_id}]")
                # Not READY yet: keep systemd's start timeout from killing a daemon that
                # is only waiting for its database.
                self.notifier.extend_timeout(delay + self.config.database.connect_timeout + 5)
                self._sleep(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY)

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
            self._handle_signals()
            self.supervisor.reap()
            self._enforce_limits()
            self._reconnect_if_due()
            self._flush_outcomes()
            self._renew_if_due()
            # Claim and hand out before the registry heartbeat: a woken idle daemon
            # starts the job first (latency) and does its bookkeeping after.
            self._claim_if_wanted()
            self._dispatch()
            self._registry_if_due()
            self._keep_warm()
            if self._finished():
                return
            self._report_status()
            self._wait()

    def _finished(self) -> bool:
        if self.state not in ("draining", "stopping"):
            return False
        busy = bool(self.in_flight) or any(c.pid is not None for c in self.supervisor.children)
        if not busy and not self.outcomes:
            self._deregister()
            return True
        deadline = self.timers.exit_deadline
        if deadline is not None and time.monotonic() >= deadline:
            if self.outcomes:
                log.error(
                    "exiting with %d outcome(s) unwritten (database unreachable); "
                    "those jobs will run again when their leases expire",
                    len(self.outcomes),
                )
            self._deregister()
            return True
        return False

    def _next_deadline(self) -> float:
        t = self.timers
        now = time.monotonic()
        candidates = [t.renew_at, t.registry_at, now + 1.0]
        # Claim timers only matter with a free slot; past ones would spin the loop.
        if self._may_claim() and self._free_slots() > 0:
            candidates.append(t.poll_at)
            if t.scheduled_at is not None:
                candidates.append(t.scheduled_at)
            if t.notified_at is not None:
                candidates.append(t.notify_claim_at + NOTIFY_CLAIM_INTERVAL)
        if not self.db.ok:
            candidates.append(self.db.reconnect_at)
        if self.notifier.watchdog_interval:
            candidates.append(t.watchdog_at)
        if t.drain_deadline is not None:
            candidates.append(t.drain_deadline)
        if any(j.unsaved for j in self.in_flight.values()):
            candidates.append(t.progress_at)
        for j in self.in_flight.values():
            candidates.append(j.deadline)
            if j.kill_at is not None:
                candidates.append(j.kill_at)
            if j.started_at is not None and j.stop_reason is None:
                if j.handler.timeout is not None:
                    candidates.append(j.started_at + j.handler.timeout)
                if j.handler.heartbeat_timeout is not None:
                    candidates.append(j.last_beat + j.handler.heartbeat_timeout)
        return min(candidates)

    def _wait(self) -> None:
        if self.signals:
            return
        timeout = max(0.0, self._next_deadline() - time.monotonic())
        for key, _ in self.selector.select(timeout):
            kind, obj = key.data
            if kind == "wake":
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            elif kind == "child":
                self.supervisor.readable(obj)
            elif kind == "listen" and self.db.notified():
                # Coalesced: however many notifications arrive (any role may NOTIFY),
                # they cause at most one claim per NOTIFY_CLAIM_INTERVAL.
                self.timers.notified_at = self.timers.notified_at or time.monotonic()

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

    # -- signals and shutdown levels ---------------------------------------------------

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.popleft()
            if sig in (signal.SIGTERM, signal.SIGINT):
                if self.state in ("draining", "drained"):
                    self.terminate(f"second {signal.Signals(sig).name}")
                elif self.state != "stopping":
                    self.drain(f"{signal.Signals(sig).name} received")
            elif sig == signal.SIGHUP:
                self.reload()

    def drain(self, why: str) -> None:
        """Stop claiming; let jobs finish until the drain timeout, then stop them."""
        w = self.config.worker
        log.info(
            "draining (%s): %d job(s) in flight, drain timeout %s",
            why,
            len(self.in_flight),
            format_duration(w.drain_timeout),
        )
        self.state = "draining"
        now = time.monotonic()
        self.timers.drain_deadline = now + w.drain_timeout
        self.timers.exit_deadline = now + w.drain_timeout + w.kill_grace + 30.0
        self.notifier.stopping(self._status_text())
        # Keep systemd's stop timeout from killing jobs still inside the drain timeout.
        self.notifier.extend_timeout(w.drain_timeout + w.kill_grace + 30.0)
        for child in self.supervisor.idle():
            self.supervisor.retire(child)
        for job in list(self.in_flight.values()):
            if job.child is None:  # claimed, never started: hand it straight back
                self._stop(job, "drain")
            else:
                job.child.send({"t": "shutdown"})

    def terminate(self, why: str) -> None:
        """Stop every child now; their jobs are released."""
        log.info("terminating (%s): stopping %d job(s)", why, len(self.in_flight))
        if self.state != "draining":
            self.drain(why)
        self.state = "stopping"
        for job in list(self.in_flight.values()):
            self._stop(job, "terminate")

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
            modules = sorted({h.module for h in new.handlers.values()})
            self.supervisor.settings = self._child_settings_for(new)
            self.supervisor.start_forkserver(modules, self._child_settings_for(new))
        except (ConfigError, RuntimeError, OSError) as exc:
            log.error("reload failed, keeping the old config: %s", exc)
            # One line: STATUS= is one assignment of a newline-separated message.
            self.reload_error = f"reload failed: {logs.escape(str(exc))}"
            self.notifier.ready(self._status_text())
            return
        for warning in file_warnings(new):
            log.warning("%s", warning)
        self.config = new
        self.reload_error = ""
        self.claim_wanted = True
        log.info(
            "reloaded %s: %d slots, queues %s, handlers %s",
            self.config_path,
            new.worker.slots,
            ", ".join(new.queues),
            ", ".join(new.handlers),
        )
        self.notifier.ready(self._status_text())

    @staticmethod
    def _child_settings_for(config: Config) -> dict[str, Any]:
        return {"max_jobs_per_child": config.worker.max_jobs_per_child}

    def _shutdown_processes(self) -> None:
        self.depth_counter.stop()
        self.metrics.stop()
        self.supervisor.signal_all(signal.SIGKILL)
        self.supervisor.stop_forkserver()
        self.db.close()

    # -- children: messages, exits, limits ---------------------------------------------

    def _on_message(self, child: Child, message: dict[str, Any]) -> None:
        job = self.in_flight.get(child.job) if child.job is not None else None
        if job is None or message.get("id", job.job.id) != job.job.id:
            return
        kind = message.get("t")
        now = time.monotonic()
        if kind == "started":
            job.started_at = job.last_beat = now
            log.info(
                "%s: started in child %s (%.1f ms after the claim)",
                job.name,
                child.pid,
                (now - job.claimed_at) * 1000,
                extra={
                    "fields": {
                        "job_id": job.job.id,
                        "handler": job.job.handler,
                        "attempt": job.job.attempt,
                        "pid": child.pid,
                        "event": "started",
                    }
                },
            )
            if not job.job.rescued:  # a rescued job's run_at predates its lost attempt
                self.metrics.observe_job_start(job.job.run_at, job.job.created_at)
        elif kind == "beat":
            job.last_beat = now
            for key in ("progress", "checkpoint"):
                if key in message:
                    # Encoded (and so checked) here, once: one job's odd value must never
                    # fail the renewal statement that carries every job's lease.
                    try:
                        setattr(job, key, encode_json(message[key]))
                        job.unsaved = True
                    except Exception as exc:
                        log.warning("%s: %s not saved: %s", job.name, key, short_error(exc))
        elif kind in ("done", "error", "interrupted"):
            if kind == "done" and message.get("result") is not None:
                try:
                    message["result"] = encode_json(message["result"])
                except Exception as exc:
                    message = {
                        "t": "error",
                        "id": job.job.id,
                        "error": f"the result cannot be stored: {short_error(exc)}",
                        "traceback": "",
                    }
            job.report = message
            child.job = None
            self._settle(job, message)

    def _on_child_exit(self, child: Child, status: int) -> None:
        job = self.in_flight.get(child.job) if child.job is not None else None
        if job is not None and job.child is child:
            self._settle(job, None, exit_description=child.broken or describe_exit(status))
        elif status != 0 and not child.exiting:
            log.warning("idle child %s %s", child.pid, describe_exit(status))
        self.claim_wanted = self.claim_wanted or self.backlog

    def _stop(self, job: InFlight, reason: str, *, now_kill: bool = False) -> None:
        """Stop a job's child: SIGTERM to its group, SIGKILL after the kill grace."""
        if job.stop_reason is None:
            job.stop_reason = reason
        if job.child is None:
            self._settle(job, None)
            return
        if now_kill:
            job.child.signal_group(signal.SIGKILL)
            job.kill_at = None
        elif job.kill_at is None:
            job.child.signal_group(signal.SIGTERM)
            job.kill_at = time.monotonic() + self.config.worker.kill_grace

    def _enforce_limits(self) -> None:
        now = time.monotonic()
        t = self.timers
        if t.drain_deadline is not None and now >= t.drain_deadline and self.in_flight:
            log.info("drain timeout reached: stopping %d job(s)", len(self.in_flight))
            for job in list(self.in_flight.values()):
                self._stop(job, "drain")
            t.drain_deadline = None
        for job in list(self.in_flight.values()):
            h = job.handler
            if now >= job.deadline and job.stop_reason != "lease lost":
                # Self-fencing: the lease may be gone; the job must not run on.
                log.error("%s: lease not renewed in time; stopping it", job.name)
                self.metrics.lease_lost(job.handler.name)
                self._stop(job, "lease lost", now_kill=True)
            elif job.kill_at is not None and now >= job.kill_at:
                job.child.signal_group(signal.SIGKILL) if job.child else None
                job.kill_at = None
            elif job.started_at is not None and job.stop_reason is None:
                if h.timeout is not None and now - job.started_at >= h.timeout:
                    self._stop(job, "timeout")
                elif h.heartbeat_timeout is not None and (
                    now - job.last_beat >= h.heartbeat_timeout
                ):
                    self._stop(job, "stuck")
        self.supervisor.prune_stuck_starts(30.0)

    def _settle(
        self, job: InFlight, report: dict[str, Any] | None, exit_description: str = ""
    ) -> None:
        """Decide a finished attempt's outcome (once) and queue it for the database."""
        if self.in_flight.pop(job.job.id, None) is None:
            return
        if job.child is not None and job.child.job == job.job.id:
            job.child.job = None
        draining = self.state in ("draining", "stopping")
        self.outcomes.append(decide(job, report, exit_description, draining, self.config.worker))
        self.claim_wanted = self.claim_wanted or self.backlog

    # -- database ----------------------------------------------------------------------

    def _flush_outcomes(self) -> None:
        """Write what finished attempts left: all completions in one statement, the
        other outcomes one by one. Kept in memory while the database is away."""
        while self.outcomes and self.db.ok:
            completions = [o for o in self.outcomes if o.kind == "complete"]
            # After a failed write, one at a time: a value the database refuses must
            # cost only its own job's outcome, not the whole batch's.
            batch = (
                completions
                if completions and not any(o.failed_writes for o in self.outcomes)
                else [self.outcomes[0]]
            )
            written = self.db.run(
                "recording outcomes",
                lambda c, b=batch: outcomes.write(c, self.worker_id, self.schema, b, self.metrics),
            )
            if written is None:
                if not self.db.ok:
                    return  # kept: written when the database is back
                for o in batch:
                    o.failed_writes += 1
                if batch[0].failed_writes < MAX_OUTCOME_WRITES:
                    return  # e.g. a statement timeout: try again next tick
                log.error(
                    "giving up recording the outcome of job(s) %s; they run again when "
                    "their leases expire",
                    ", ".join(str(o.job.id) for o in batch),
                )
            for o in batch:
                self.outcomes.remove(o)
                if o.retry_in is not None:
                    # Wake for the retry when it is due, not at the next poll.
                    retry_at = time.monotonic() + max(0.0, o.retry_in)
                    t = self.timers
                    t.scheduled_at = (
                        retry_at if t.scheduled_at is None else min(t.scheduled_at, retry_at)
                    )

    def _renew_if_due(self, only_unsaved: bool = False) -> None:
        now = time.monotonic()
        t = self.timers
        due = now >= t.renew_at
        save_progress = any(j.unsaved for j in self.in_flight.values()) and now >= t.progress_at
        if not self.db.ok or not (due or save_progress):
            return
        chosen = [j for j in self.in_flight.values() if due or j.unsaved]
        if due:
            t.renew_at = now + self.config.worker.renew_interval
        t.progress_at = now + PROGRESS_SAVE_INTERVAL
        if not chosen:
            return
        leases = [
            Lease(
                j.job.id,
                j.job.token,
                j.lease,
                j.progress if j.unsaved else None,
                j.checkpoint if j.unsaved else None,
            )
            for j in chosen
        ]
        sent_at = time.monotonic()
        results = self.db.run(
            "renewing leases", lambda c: renew(c, self.worker_id, leases, schema=self.schema)
        )
        saved = True
        if results is None and self.db.ok and any(j.unsaved for j in chosen):
            # Refused with the database up (a timeout; a value it will not store, which
            # the checks on arrival should make impossible): renew the leases alone at
            # once, so no job loses its lease to one job's progress. The values stay
            # unsaved: they go again at the next save, and with the job's outcome.
            log.warning(
                "renewing leases with the progress or checkpoints of job(s) %s failed; "
                "renewing them without",
                ", ".join(str(j.job.id) for j in chosen if j.unsaved),
            )
            bare = [Lease(lease.id, lease.token, lease.lease_seconds) for lease in leases]
            sent_at, saved = time.monotonic(), False
            results = self.db.run(
                "renewing leases", lambda c: renew(c, self.worker_id, bare, schema=self.schema)
            )
        if results is None:
            return
        by_id = {j.job.id: j for j in chosen}
        for r in results:
            job = by_id[r.id]
            if job.job.id not in self.in_flight:
                continue
            if not r.renewed:
                log.error(
                    "%s: lease lost (re-claimed elsewhere or cancelled); stopping it",
                    job.name,
                    extra={"fields": {"job_id": job.job.id, "event": "lease_lost"}},
                )
                self.metrics.lease_lost(job.handler.name)
                self._stop(job, "lease lost", now_kill=True)
                continue
            job.unsaved = job.unsaved and not saved
            self.metrics.lease_renewed()
            job.deadline = sent_at + job.lease - fence_margin(job.lease)
            if job.child is not None:
                job.child.send({"t": "lease", "deadline": job.deadline})
            if r.cancel_requested and job.stop_reason is None:
                job.cancel_seen = True
                log.info("%s: cancel requested; stopping it", job.name)
                if job.child is not None:
                    job.child.send({"t": "cancel"})
                self._stop(job, "cancel")

    def _reconnect_if_due(self) -> None:
        if self.db.reconnect_if_due():
            t = self.timers
            t.renew_at = t.registry_at = 0.0  # renew at once: leases may be short by now
            self.claim_wanted = True
            self.db.listen(self.config.worker.poll_interval)


def run_daemon(
    config: Config,
    *,
    dsn: str | None = None,
    schema: str | None = None,
    config_path: str | None = None,
) -> int:
    try:
        return Daemon(config, dsn=dsn, schema=schema, config_path=config_path).run()
    except Exception as exc:
        # The traceback goes through the log formatter: masked, each line escaped.
        summary = scrub(f"{type(exc).__name__}: {exc}", dsn)
        log.critical("daemon crashed: %s", summary, exc_info=True)
        return ExitCode.FAILURE
