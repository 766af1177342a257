"""Chaos soak: three real daemons on a private PostgreSQL, thousands of jobs, faults at
random intervals; then the invariants are checked and a summary printed.

    .venv/bin/python bench/chaos_soak.py --short        # ~1 minute, 800 jobs (the test)
    .venv/bin/python bench/chaos_soak.py                # ~12 minutes, 5,000 jobs
    .venv/bin/python bench/chaos_soak.py --jobs 20000 --duration 3600 --seed 7

Jobs run 0-2 s with progress heartbeats; some raise, a few die by os._exit, a few always
fail (they end dead). Faults: kill -9 of a child, of a parent (restarted), of a fork
server; SIGSTOP/SIGCONT of a parent (sometimes past its lease); SIGTERM and restart;
`pgworkerd drain`/`resume`; PostgreSQL restart -m fast. Leases are 3 s, renewed every 1 s.

Poison rows of every kind the daemon cannot load or hand to a child (a 5,001-digit
integer, JSON nested 5,000 deep, a number beyond a float, run_at -infinity or before year
1, a checkpoint nested 5,000 deep, a payload over the frame limit once re-encoded) are
inserted every 2 s, as a direct INSERT or an old row would hold them.

Every execution is recorded to a file by the handler (bench/chaos_handlers.py). Checked
at the end (exit 1 if one fails): no two executions of one job overlap; no job is lost or
stuck (all completed or dead once the run settles); no outcome recorded twice (one
accepted completion per completed job, matching a finished execution of its last
attempt; none for dead jobs); attempts accounted for; no daemon exits on its own; no job
but the doomed ones ends dead; every poison row is dead with the reason and never reached
a handler; the fleet-wide limits held: a tenth of the jobs are of handler "limited"
(max_running = 3, max_running_per_key = 1, four concurrency keys), and at no instant did
more of its executions run, nor two of one key.
Every execution starts subprocesses (a new session, an orphaned grandchild): once the run
settled none of them is alive, found by walking /proc (containment).
Every daemon declares a one-second schedule (removed by a SIGHUP reload
before the run settles): every scheduled job belongs to exactly one tick, and no two
consecutive ticks were caught up late (no catch-up burst).
Issue 24's features are in the workload, with their invariants: dependent jobs (a child
of 1-3 earlier jobs, of the same enqueue_many call or by id): no child started before all
its parents completed, and none ran whose parent did not; fan-outs returning follow-ups
(pgworkerd.Done(then=...)): each completed one's follow-ups exist exactly once (none for
one that did not complete); waits (pgworkerd.WaitFor) answered by a signal sent at a
random moment, before or after the wait: every signalled wait resumed and saw its
signal's payload, and no job is left suspended with its signal there; waits under a
correlation key, signalled by key (signal_send_by_key_v2), mostly before the wait (the
signal parked, then handed over by the WaitFor): each job saw its signal's payload
exactly once (one signal row, nothing left parked, every execution after the wait saw
that payload, none waited again); jobs with `expire_in` of a few seconds, some of a
handler no daemon serves and some of a handler with one slot in the whole fleet (so no
claim reaches most of them in time: the expiry sweep must end them): none started
(claimed) at or after its expires_at, one not completed ended cancelled as expired, and
every one never claimed ended cancelled as expired and reached no handler.
Issue 25's features are in the workload, with their invariants: a start-rate limited
fair handler "rated" (a burst up front that the rate must space): no window of a second
holds more starts than its rate, in all or per key; a fair handler "shared" with weights
and a backlog enqueued key after key: in every window of 40 starts while every key is
due, each key's starts within 5 of its weighted share; no slot idles while work is due
(per daemon samples every 0.5 s: never 3 s with a free slot while one job of the
unlimited handler stays due); dedupe windows (handler "deduped", one call per enqueue,
random policies): no key held by two jobs within its window.
Also printed: jobs per status, faults per kind, executions per job, and the time from a
fault to the affected job running again (p50/p99).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from daemon_bench import children_of

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate
from pgworkerd.signals import SignalRefused
from pgworkerd.signals import signal as client_signal

BENCH_DIR = Path(__file__).resolve().parent
PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))
SCHEMA = "chaos"
LEASE = 3.0
SLOTS = 6
WORKER = {
    "slots": SLOTS,
    "lease": "3s",
    "renew_interval": "1s",
    "poll_interval": "1s",
    "drain_timeout": "3s",
    "kill_grace": "1s",
    "warm_children": 2,
    "backoff": "0.2s",
    "backoff_max": "2s",
}
# Periodic jobs: every daemon declares a one-second schedule, so each tick is raced by
# all three through every fault; removed (SIGHUP) before the soak settles.
SCHEDULE = """
[schedules.chaos_tick]
every = "1s"
handler = "chaos"
overlap = "allow"
max_attempts = 10
payload = { d = 0.05, raise = 0.0, crash = 0.0, scheduled = true }
"""
# A run fired this long after its tick was caught up (a 1 s tick is on time for 2 s).
SCHEDULE_LATE = 2.5
# kind: weight. pg_restart is also capped per run (see Soak.pg_restarts_left).
FAULTS = {
    "kill_child": 4.0,
    "kill_parent": 2.0,
    "kill_forkserver": 1.5,
    "sigstop": 2.0,
    "sigterm_restart": 1.0,
    "drain_resume": 1.0,
    "pg_restart": 0.5,
}
JOB_TITLE = re.compile(r"pgworkerd: job (\d+) \S+ attempt (\d+)")
# Poison rows, written the way an old row or a direct INSERT (no enqueue checks) holds
# them: (payload, run_at, checkpoint). Each must end dead at once with the reason, alone:
# the daemons never exit, and no other job loses an attempt to it.
DEEP = 5000
POISON: dict[str, tuple[str, str | None, str | None]] = {
    "integer_5001_digits": ('{"x": 1e5000}', None, None),
    "payload_nested_5000": ('{"a":' * DEEP + "1" + "}" * DEEP, None, None),
    "number_beyond_float": ('{"x": 1' + "0" * 400 + ".5}", None, None),
    "run_at_minus_infinity": ("{}", "-infinity", None),
    "run_at_before_year_1": ("{}", "0044-03-15 00:00:00+00 BC", None),
    "checkpoint_nested_5000": ("{}", None, "[" * DEEP + "]" * DEEP),
    "payload_over_frame_limit": ('{"s": "' + "\U0001f600" * (6 * 1024 * 1024) + '"}', None, None),
}
# At most one 24 MiB payload per this many seconds: it is a lot of memory to parse.
POISON_INTERVAL = 2.0
# Fleet-wide limits: this share of the jobs is of handler "limited", whose executions
# must never number more than LIMITED_RUNNING at once, nor two of one key.
LIMITED_SHARE = 0.1
LIMITED_RUNNING = 3
LIMITED_PER_KEY = 1
LIMITED_KEYS = ("k0", "k1", "k2", "k3")
# Start-rate limits and fair share (issue 25, schema 33): this share of the jobs is of the
# fair handler "rated", whose starts (attempts.started_at: the claims' times) must never
# number more than RATED_PER_SECOND in any second, nor RATED_PER_KEY of one key.
RATED_SHARE = 0.04
RATED_PER_SECOND = 5
RATED_PER_KEY = 2
RATED_KEYS = ("r0", "r1", "r2")
RATED_BURST = 5  # jobs of each key enqueued up front, at once: the rate must space them
# Fair share with weights (issue 25): handler "shared" is fair over its keys, weighted
# SHARED_WEIGHTS, and capped at SHARED_RUNNING fleet-wide so that its jobs queue. Its
# backlog (SHARED_SHARE of --jobs, in proportion to the weights, so that every key stays
# due until near the end) is enqueued up front one key after the other, the heaviest
# last: FIFO would serve the keys one by one. Invariant: in any SHARE_WINDOW consecutive
# starts (attempts' started_at, claim order) during which every key had a job due (enqueued
# and not yet started), each key started within SHARE_BOUND of SHARE_WINDOW * its share of
# the weights. SHARE_BOUND is the largest weight (a turn cut at either end of a window)
# plus 2 (two claims that began in one order and took the handler's lock in the other, or
# a lost job rescued out of turn).
SHARED_WEIGHTS = {"f0": 3, "f1": 1, "f2": 1}
SHARED_RUNNING = 3
SHARED_SHARE = 0.12
SHARE_WINDOW = 40
SHARE_BOUND = max(SHARED_WEIGHTS.values()) + 2
# No slot idles while work is due: every IDLE_SAMPLE s the soak samples, per daemon that
# is up, its running jobs (status running, locked_by it) and the due jobs of the unlimited
# handler "chaos" (pending, run_at passed). A daemon idles a slot when, through samples
# spanning at least IDLE_GRACE s, it had fewer running jobs than its slots while a chaos
# job was due, one due at the first sample still pending at the last. The grace covers a
# claim's latency on a loaded box (a daemon claims when a slot frees, on a notification, and
# at least every poll_interval): samples within IDLE_GRACE of the daemon's (re)start,
# SIGCONT or resume, or of a PostgreSQL restart, do not count.
IDLE_SAMPLE = 0.5
IDLE_GRACE = 3.0
# Dedupe windows (issue 25): handler "deduped"'s jobs are enqueued one call each (a reject
# aborts its call) with one of DEDUPE_KEYS, dedupe_window DEDUPE_WINDOW and a random policy.
# Invariant: of two jobs of one key, the later was created (the enqueue's now()) at or
# after the earlier finished + DEDUPE_WINDOW: never two live, nor one within the window.
DEDUPE_EVERY = 0.25  # seconds between two enqueues of a deduped job, about
DEDUPE_KEYS = ("u0", "u1", "u2", "u3", "u4")
DEDUPE_WINDOW = 1.5
DEDUPE_POLICIES = ("existing", "reject", "debounce")
# Issue 24's features (shares of the plain jobs made into each kind).
CHILD_SHARE = 0.08  # a child of 1-3 earlier plain jobs (the same call's, or by id)
# of those, a child also of a doomed job (the same call's, or by id: a parent that dies,
# maybe while a sibling parent completes), its on_parent_failure "cancel" or "run"
DOOMED_PARENT_SHARE = 0.3
FAN_OUT_SHARE = 0.04  # returns 1-4 follow-ups
WAITER_SHARE = 0.05  # waits for SIGNAL, sent at a random moment (before or after the wait)
EXPIRING_SHARE = 0.05  # expire_in EXPIRE_IN seconds
# waits under a correlation key (its own), signalled by key (signal_send_by_key_v2): most
# at once, so before the wait (parked, handed over by the WaitFor), the rest at a random
# moment (either side)
KEYED_SHARE = 0.04
# expiring jobs no claim can reach in time: of a handler no daemon serves (only the
# fleet's expiry sweep ends them), and of handler "narrow", one execution at a time in the
# whole fleet, each NARROW_SECONDS long (its one slot busy: most expire queued)
UNSERVED_SHARE = 0.02
NARROW_SHARE = 0.03
NARROW_SECONDS = (1.0, 3.0)
# (shorter than EXPIRE_IN: the last of them ends soon after the faults, not in the settle)
UNREACHED_EXPIRE_IN = (0.5, 8.0)
UNSERVED = "nobody-serves-this"
# What a signal by key may come to and still be delivered: handed to the waiting job
# (resumed), kept by the job for its wait, or parked until its WaitFor takes it.
BY_KEY_DELIVERED = ("resumed", "kept", "parked")
SIGNAL = "go"
# A wait's timeout: never reached in a run, so a wait ended by it is a lost signal.
WAIT_TIMEOUT = "1h"
# When a waiter is signalled: a third at once (before its wait, mostly), a third after a
# random delay (either side), a third once it is seen suspended (after the wait).
SIGNAL_DELAY = (0.0, 8.0)
SUSPENDED_POLL = 0.3  # seconds between looks for the last third (given up after a minute)
EXPIRE_IN = (0.5, 20.0)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


@dataclass
class Fault:
    kind: str
    at: float  # time.time()
    target: str
    jobs: list[int] = field(default_factory=list)  # in flight there, affected


class Daemon:
    """One daemon slot (tag d0..d2): restarted as new processes, one log for all."""

    def __init__(self, tag: str, dsn: str, config: Path, workdir: Path, execs: Path) -> None:
        self.tag, self.dsn, self.config, self.workdir, self.execs = tag, dsn, config, workdir, execs
        self.log_path = workdir / f"daemon-{tag}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.worker_id = ""
        self.generation = 0
        self.state = "down"  # up, stopped (SIGSTOP), draining (db drain), terminating, dead
        self.up_since = 0.0  # time.time() it last became "up" (started, continued, resumed)
        self.unexpected_exits: list[str] = []

    def start(self) -> None:
        self.generation += 1
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {
            **os.environ,
            "PYTHONPATH": str(BENCH_DIR),
            "CHAOS_EXECS": str(self.execs),
            "CHAOS_TAG": f"{self.tag}.{self.generation}",
            "CHAOS_MARKER": MARKER,
        }
        env.pop("NOTIFY_SOCKET", None)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    PGWORKERD,
                    "--dsn",
                    self.dsn,
                    "--schema",
                    SCHEMA,
                    "--config",
                    str(self.config),
                    "run",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        ready = re.compile(rb"running as (\S+):")
        while True:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                m = ready.search(f.read())
            if m:
                self.worker_id = m[1].decode()
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon {self.tag} did not start; see {self.log_path}")
            time.sleep(0.05)
        self.set_up()

    def set_up(self) -> None:
        self.state = "up"
        self.up_since = time.time()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running_jobs(self) -> dict[int, int]:
        """job id -> child pid, from the children's titles."""
        found = {}
        for pid in children_of(self.pid):
            m = JOB_TITLE.match(title(pid))
            if m:
                found[int(m[1])] = pid
        return found

    def forkserver(self) -> int | None:
        found = [p for p in children_of(self.pid) if "pgworkerd.worker.forkserver" in title(p)]
        return found[0] if found else None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGCONT + SIGTERM, wait, SIGKILL if it will not go; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            self.unexpected_exits.append("did not stop within 30 s of SIGTERM")
            return None


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir = workdir
        self.execs = workdir / "executions.jsonl"
        self.pg = LocalPostgres(workdir / "pg" if args.keep else None)
        self.daemons: list[Daemon] = []
        self.faults: list[Fault] = []
        self.actions: list[tuple[float, Callable[[], None]]] = []  # monotonic, what
        self.pg_restarts_left = args.pg_restarts
        # Every kind once first (in random order), so even a short run covers them all.
        self.unseen = self.rng.sample(list(FAULTS), len(FAULTS))
        self.ids: list[int] = []
        self.plain_ids: list[int] = []  # ids of plain chaos jobs: parents by id
        self.doomed_ids: list[int] = []  # ids of doomed jobs: parents that die, by id
        self.signals: dict[int, tuple[str, str]] = {}  # waiter -> (token, outcome)
        self.keys = itertools.count()  # correlation keys, one per keyed waiter
        self.poison: dict[int, str] = {}  # job id -> kind
        self.poison_kinds = self.rng.sample(list(POISON), len(POISON))  # each once first
        self.notes: list[str] = []
        self.left_behind: list[int] = []  # handler subprocesses alive after the settle
        self.samples: list[Sample] = []  # for "no slot idles while work is due"
        self.next_sample = 0.0
        self.look_conn: psycopg.Connection | None = None
        self.pg_restarted_at: list[float] = []  # time.time()
        self.next_deduped = 0.0
        self.dedupe_calls: Counter[str] = Counter()  # "policy: outcome" -> calls

    # -- set-up ------------------------------------------------------------------------

    def setup(self) -> None:
        self.pg.start()
        self.pg.create_database("chaos")
        self.dsn = self.pg.dsn("chaos")
        migrate(self.dsn, schema=SCHEMA)
        lines = ["[worker]", 'name = "chaos"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in WORKER.items()]
        lines += ["", "[handlers.chaos]", 'target = "chaos_handlers:run"']
        lines += ["", "[handlers.limited]", 'target = "chaos_handlers:run"']
        lines += [f"max_running = {LIMITED_RUNNING}", f"max_running_per_key = {LIMITED_PER_KEY}"]
        lines += ["", "[handlers.waiter]", 'target = "chaos_handlers:wait"']
        lines += ["", "[handlers.narrow]", 'target = "chaos_handlers:run"', "max_running = 1"]
        lines += ["", "[handlers.rated]", 'target = "chaos_handlers:run"', "fair = true"]
        lines += [f'rate = "{RATED_PER_SECOND}/s"', f'rate_per_key = "{RATED_PER_KEY}/s"']
        lines += ["", "[handlers.shared]", 'target = "chaos_handlers:run"', "fair = true"]
        lines += [f"max_running = {SHARED_RUNNING}", f"weights = {inline_table(SHARED_WEIGHTS)}"]
        lines += ["", "[handlers.deduped]", 'target = "chaos_handlers:run"']
        config = self.workdir / "chaos.toml"
        config.write_text("\n".join(lines) + "\n" + SCHEDULE)
        for n in range(3):
            d = Daemon(f"d{n}", self.dsn, config, self.workdir, self.execs)
            d.start()
            self.daemons.append(d)

    def job_specs(self, count: int) -> list[client.JobSpec]:
        specs = []
        for _ in range(count):
            r = self.rng.random()
            d = self.rng.uniform(0, 0.3) if r < 0.6 else self.rng.uniform(0.3, 2.0)
            if self.rng.random() < 0.02:  # doomed: fails every attempt, ends dead
                specs.append(client.JobSpec("chaos", {"d": d, "raise": 1.0}, max_attempts=3))
            elif self.rng.random() < LIMITED_SHARE:
                payload = {"d": round(d, 3), "raise": 0.08, "crash": 0.02}
                key = self.rng.choice(LIMITED_KEYS)
                specs.append(
                    client.JobSpec("limited", payload, max_attempts=10, concurrency_key=key)
                )
            elif self.rng.random() < RATED_SHARE:
                payload = {"d": round(d, 3), "raise": 0.08, "crash": 0.02}
                key = self.rng.choice(RATED_KEYS)
                # urgent: due in bulk, not queued behind the backlog (the rate is what holds
                # them back)
                specs.append(
                    client.JobSpec(
                        "rated", payload, priority=-1, max_attempts=10, concurrency_key=key
                    )
                )
            else:
                specs.append(self.issue24_spec(round(d, 3), specs))
        return specs

    def issue24_spec(self, d: float, earlier: list[client.JobSpec]) -> client.JobSpec:
        """A plain chaos job, or one of issue 24's kinds: a child of earlier plain jobs, a
        fan-out, a waiter (by id or by key), an expiring job (served, narrow, unserved)."""
        payload: dict[str, Any] = {"d": d, "raise": 0.08, "crash": 0.02}
        plain = [s for s in earlier if s.payload.keys() == {"d", "raise", "crash"}]
        doomed: list[int | client.JobSpec] = [
            s for s in earlier if s.payload.get("raise") == 1.0
        ] + self.doomed_ids
        r = self.rng.random()
        if r < CHILD_SHARE and (plain or self.plain_ids):
            parents: list[int | client.JobSpec] = []
            for _ in range(self.rng.randint(1, 3)):
                if plain and (not self.plain_ids or self.rng.random() < 0.7):
                    parents.append(self.rng.choice(plain))
                else:
                    parents.append(self.rng.choice(self.plain_ids))
            policy = "cancel"
            if doomed and self.rng.random() < DOOMED_PARENT_SHARE:
                parents.append(self.rng.choice(doomed))
                policy = self.rng.choice(("cancel", "run"))
            unique = list({p if isinstance(p, int) else id(p): p for p in parents}.values())
            return client.JobSpec(
                "chaos",
                {**payload, "child": True},
                max_attempts=10,
                after=unique,
                on_parent_failure=policy,
            )
        r -= CHILD_SHARE
        if r < FAN_OUT_SHARE:
            return client.JobSpec(
                "chaos", {**payload, "then": self.rng.randint(1, 4)}, max_attempts=10
            )
        r -= FAN_OUT_SHARE
        if r < WAITER_SHARE:
            waiter = {**payload, "signal": SIGNAL, "timeout": WAIT_TIMEOUT}
            return client.JobSpec("waiter", waiter, max_attempts=10)
        r -= WAITER_SHARE
        if r < KEYED_SHARE:
            key = f"chaos-{self.args.seed}-{next(self.keys)}"
            waiter = {**payload, "signal": SIGNAL, "timeout": WAIT_TIMEOUT, "key": key}
            return client.JobSpec("waiter", waiter, max_attempts=10)
        r -= KEYED_SHARE
        if r < UNSERVED_SHARE:
            expire_in = round(self.rng.uniform(*UNREACHED_EXPIRE_IN), 3)
            return client.JobSpec(UNSERVED, {"expiring": True}, expire_in=expire_in)
        r -= UNSERVED_SHARE
        if r < NARROW_SHARE:
            narrow = {**payload, "d": round(self.rng.uniform(*NARROW_SECONDS), 3)}
            expire_in = round(self.rng.uniform(*UNREACHED_EXPIRE_IN), 3)
            return client.JobSpec(
                "narrow", {**narrow, "expiring": True}, max_attempts=10, expire_in=expire_in
            )
        r -= NARROW_SHARE
        if r < EXPIRING_SHARE:
            expire_in = round(self.rng.uniform(*EXPIRE_IN), 3)
            return client.JobSpec(
                "chaos", {**payload, "expiring": True}, max_attempts=10, expire_in=expire_in
            )
        return client.JobSpec("chaos", payload, max_attempts=10)

    def enqueue(self, conn: psycopg.Connection, count: int) -> None:
        if count > 0:
            specs = self.job_specs(count)
            ids = client.enqueue_many(conn, specs, schema=SCHEMA)
            self.ids += ids
            for spec, job_id in zip(specs, ids, strict=True):
                if spec.handler == "waiter" and "key" in spec.payload:
                    # by key: mostly at once (before its wait: parked), else either side
                    at_once = self.rng.random() < 2 / 3
                    delay = 0.0 if at_once else self.rng.uniform(*SIGNAL_DELAY)
                    key = spec.payload["key"]
                    self.later(delay, lambda j=job_id, k=key: self.send_signal(j, key=k))
                elif spec.handler == "waiter":
                    when = self.rng.choice(("at once", "later", "once suspended"))
                    if when == "once suspended":
                        give_up = time.monotonic() + 60
                        self.later(
                            SUSPENDED_POLL,
                            lambda j=job_id, g=give_up: self.signal_if_suspended(j, g),
                        )
                    else:
                        delay = 0.0 if when == "at once" else self.rng.uniform(*SIGNAL_DELAY)
                        self.later(delay, lambda j=job_id: self.send_signal(j))
                elif spec.handler == "chaos" and spec.payload.keys() == {"d", "raise", "crash"}:
                    self.plain_ids.append(job_id)
                elif spec.payload.get("raise") == 1.0:
                    self.doomed_ids.append(job_id)

    def signal_if_suspended(self, job_id: int, give_up: float) -> None:
        """Signal the waiter once it is seen suspended (or when giving up), else look again
        later (the settle keeps looking)."""
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                [(status,)] = conn.execute(
                    f"SELECT status::text FROM {SCHEMA}.jobs WHERE id = %s", (job_id,)
                ).fetchall()
        except psycopg.OperationalError:
            status = "unknown"  # PostgreSQL restarting
        if status == "suspended" or time.monotonic() > give_up:
            self.send_signal(job_id)
        else:
            self.later(SUSPENDED_POLL, lambda: self.signal_if_suspended(job_id, give_up))

    def send_signal(self, job_id: int, key: str | None = None) -> None:
        """Signal a waiter (a token it must see), by id or by its correlation key (as a
        webhook would, not knowing the id), retrying while PostgreSQL restarts (the same
        token: a retry of a send that did land is ignored, first write wins)."""
        token = f"signal-{job_id}-{self.rng.randrange(1 << 30)}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                    sent = client_signal(
                        conn,
                        None if key is not None else job_id,
                        SIGNAL,
                        {"token": token},
                        key=key,
                        schema=SCHEMA,
                    )
                self.signals[job_id] = (token, sent.outcome)
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.notes.append(f"signal to job {job_id} not sent: PostgreSQL down")
                    return
                time.sleep(0.2)
            except SignalRefused as exc:
                self.signals[job_id] = (token, f"refused: {exc}")
                return

    def enqueue_shared(self, conn: psycopg.Connection, count: int) -> None:
        """The fair handler's backlog: each key's share of `count`, key after key, the
        heaviest last (FIFO would start the keys one after the other)."""
        total = sum(SHARED_WEIGHTS.values())
        specs = []
        for key, weight in sorted(SHARED_WEIGHTS.items(), key=lambda kw: (kw[1], kw[0])):
            for _ in range(max(1, count * weight // total)):
                payload = {"d": round(self.rng.uniform(0.05, 0.3), 3), "raise": 0.05, "crash": 0.01}
                specs.append(
                    client.JobSpec("shared", payload, max_attempts=10, concurrency_key=key)
                )
        self.ids += client.enqueue_many(conn, specs, schema=SCHEMA)

    def enqueue_rated_burst(self, conn: psycopg.Connection) -> None:
        """RATED_BURST jobs of each rated key at once: more than the rate lets start in a
        second, so the rate (not the arrivals) spaces them."""
        specs = [
            client.JobSpec(
                "rated",
                {"d": 0.05, "raise": 0.0, "crash": 0.0},
                priority=-1,
                max_attempts=10,
                concurrency_key=key,
            )
            for key in RATED_KEYS
            for _ in range(RATED_BURST)
        ]
        self.ids += client.enqueue_many(conn, specs, schema=SCHEMA)

    def enqueue_deduped(self) -> None:
        """Now and then one job of handler "deduped", its own call: a key of DEDUPE_KEYS,
        held DEDUPE_WINDOW after it finished, and a random policy."""
        if time.monotonic() < self.next_deduped:
            return
        self.next_deduped = time.monotonic() + self.rng.uniform(0, 2 * DEDUPE_EVERY)
        policy = self.rng.choice(DEDUPE_POLICIES)
        options: dict[str, Any] = {"dedupe_policy": policy}
        if policy == "debounce":
            options |= {"debounce": 0.3, "debounce_max": 1.0}
        payload = {"d": round(self.rng.uniform(0.05, 0.5), 3), "raise": 0.05, "crash": 0.01}
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                [(held,)] = conn.execute(
                    f"SELECT coalesce(max(id), 0) FROM {SCHEMA}.jobs WHERE handler = 'deduped'"
                ).fetchall()
                job_id = client.enqueue(
                    conn,
                    "deduped",
                    payload,
                    max_attempts=10,
                    priority=-1,  # not behind the backlog: keys freed and taken again often
                    dedupe_key=self.rng.choice(DEDUPE_KEYS),
                    dedupe_window=DEDUPE_WINDOW,
                    schema=SCHEMA,
                    **options,
                )
            self.ids.append(job_id)
            self.dedupe_calls[f"{policy}: {'new job' if job_id > held else 'key held'}"] += 1
        except client.DuplicateJob:
            self.dedupe_calls[f"{policy}: rejected"] += 1
        except psycopg.OperationalError:
            pass  # PostgreSQL restarting

    def looking(self) -> psycopg.Connection:
        """The soak's own connection for its samples (one, not one per look: a look is
        every IDLE_SAMPLE s), opened again after PostgreSQL restarted."""
        if self.look_conn is None or self.look_conn.closed:
            self.look_conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
        return self.look_conn

    def sample(self) -> None:
        """Per daemon up, its running jobs; and the due jobs of handler "chaos"."""
        if time.monotonic() < self.next_sample:
            return
        self.next_sample = time.monotonic() + IDLE_SAMPLE
        up = {d.worker_id: d.up_since for d in self.daemons if d.state == "up"}
        try:
            conn = self.looking()
            running: dict[str, int] = dict(
                conn.execute(
                    f"SELECT locked_by, count(*) FROM {SCHEMA}.jobs"
                    " WHERE status = 'running' AND locked_by = ANY(%s) GROUP BY locked_by",
                    [list(up)],
                ).fetchall()
            )
            due = {
                r[0]
                for r in conn.execute(
                    f"SELECT id FROM {SCHEMA}.jobs WHERE handler = 'chaos'"
                    " AND status = 'pending' AND run_at <= now() AND NOT (id = ANY(%s))",
                    [list(self.poison)],
                ).fetchall()
            }
        except psycopg.OperationalError:
            self.look_conn = None
            return  # PostgreSQL restarting: no sample
        self.samples.append(
            Sample(time.time(), {w: (since, running.get(w, 0)) for w, since in up.items()}, due)
        )

    def enqueue_poison(self, conn: psycopg.Connection) -> None:
        kind = self.poison_kinds[0] if self.poison_kinds else self.rng.choice(list(POISON))
        payload, run_at, checkpoint = POISON[kind]
        [(job_id,)] = conn.execute(
            f"INSERT INTO {SCHEMA}.jobs (handler, payload, run_at, checkpoint, max_attempts)"
            " VALUES ('chaos', %s::jsonb, coalesce(%s::timestamptz, now()), %s::jsonb, 1000)"
            " RETURNING id",
            (payload, run_at, checkpoint),
        ).fetchall()
        self.poison[job_id] = kind
        if kind in self.poison_kinds:
            self.poison_kinds.remove(kind)

    # -- faults --------------------------------------------------------------------------

    def later(self, delay: float, action: Callable[[], None]) -> None:
        self.actions.append((time.monotonic() + delay, action))

    def run_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        due = [a for a in self.actions if everything or a[0] <= now]
        self.actions = [a for a in self.actions if a not in due]
        for _, action in sorted(due, key=lambda a: a[0]):
            action()

    def check_daemons(self) -> None:
        for d in self.daemons:
            if d.proc is None or d.proc.poll() is None:
                continue
            code = d.proc.returncode
            if d.state == "terminating":
                if code != 0:
                    d.unexpected_exits.append(f"exit {code} after SIGTERM")
                d.start()
            elif d.state in ("up", "draining", "stopped"):
                d.unexpected_exits.append(f"exited on its own with {code}")
                log(f"{d.tag} exited on its own with {code}; restarting")
                d.start()

    def inject(self) -> None:
        up = [d for d in self.daemons if d.state == "up"]
        kinds = dict(FAULTS)
        if len(up) < 2:  # keep one daemon working; only faults that hit no daemon
            kinds = {k: w for k, w in kinds.items() if k in ("kill_child", "pg_restart")}
        if self.pg_restarts_left <= 0:
            kinds.pop("pg_restart", None)
        if not kinds:
            return
        first = [k for k in self.unseen if k in kinds]
        kind = first[0] if first else self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
        count = len(self.faults)
        target = self.rng.choice(up) if up else None
        now = time.time()
        if kind == "kill_child":
            running = [(d, j, pid) for d in up for j, pid in d.running_jobs().items()]
            if not running:
                return
            d, job_id, pid = self.rng.choice(running)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.faults.append(Fault(kind, now, d.tag, [job_id]))
        elif kind == "pg_restart":
            in_flight = [j for d in self.daemons for j in d.running_jobs()]
            self.faults.append(Fault(kind, now, "postgres", in_flight))
            self.pg_restarts_left -= 1
            self.pg.restart("fast")
            self.pg_restarted_at.append(time.time())
        else:
            assert target is not None
            self.fault_daemon(kind, target, now)
        if len(self.faults) > count and kind in self.unseen:
            self.unseen.remove(kind)

    def fault_daemon(self, kind: str, d: Daemon, now: float) -> None:
        in_flight = list(d.running_jobs())
        if kind == "kill_parent":
            d.signal(signal.SIGKILL)
            assert d.proc is not None
            d.proc.wait(10)
            d.state = "dead"
            self.later(self.rng.uniform(0.5, 3.0), d.start)
        elif kind == "kill_forkserver":
            pid = d.forkserver()
            if pid is None:
                return
            os.kill(pid, signal.SIGKILL)
            in_flight = []  # must be unaffected
        elif kind == "sigstop":
            seconds = self.rng.uniform(1.0, 6.0)  # the child fences itself ~2 s after a renewal
            kind = f"sigstop_{'past' if seconds > LEASE else 'within'}_lease"
            d.signal(signal.SIGSTOP)
            d.state = "stopped"

            def cont(d: Daemon = d) -> None:
                d.signal(signal.SIGCONT)
                d.set_up()

            self.later(seconds, cont)
        elif kind == "sigterm_restart":
            d.signal(signal.SIGTERM)
            d.state = "terminating"
        elif kind == "drain_resume":
            worker = d.worker_id
            out = self.cli("drain", "--worker", worker)
            if out.returncode != 0:
                self.notes.append(f"drain of {worker} failed: {out.stderr.strip()}")
                return
            d.state = "draining"
            in_flight = []  # drained jobs run to their end

            def resume(d: Daemon = d, worker: str = worker) -> None:
                self.cli("resume", "--worker", worker)
                if d.state == "draining":
                    d.set_up()

            self.later(self.rng.uniform(1.0, 4.0), resume)
        self.faults.append(Fault(kind, now, d.tag, in_flight))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PGWORKERD, "--dsn", self.dsn, "--schema", SCHEMA, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    # -- the run -------------------------------------------------------------------------

    def run(self) -> None:
        a = self.args
        up_front = a.jobs // 3
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self.enqueue_shared(conn, round(a.jobs * SHARED_SHARE))
            self.enqueue_rated_burst(conn)
            self.enqueue(conn, up_front)
        start = time.monotonic()
        end = start + a.duration
        next_fault = start + self.rng.uniform(*a.fault_interval)
        next_poison = start + POISON_INTERVAL
        log(f"{a.jobs} jobs, faults for {a.duration:.0f}s")
        while time.monotonic() < end:
            # The rest of the jobs arrive steadily over the first 80 % of the window.
            due = up_front + int(
                (a.jobs - up_front) * min(1.0, (time.monotonic() - start) / (0.8 * a.duration))
            )
            poison_due = time.monotonic() >= next_poison
            if due > len(self.ids) or poison_due:
                try:
                    with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                        self.enqueue(conn, due - len(self.ids))
                        if poison_due:
                            self.enqueue_poison(conn)
                            next_poison = time.monotonic() + POISON_INTERVAL
                except psycopg.OperationalError:
                    pass  # PostgreSQL restarting: next tick
            self.run_due()
            self.check_daemons()
            self.enqueue_deduped()
            self.sample()
            if time.monotonic() >= next_fault:
                self.inject()
                next_fault = time.monotonic() + self.rng.uniform(*a.fault_interval)
            time.sleep(0.05)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self.enqueue(conn, a.jobs - len(self.ids))
        log(f"faults over ({len(self.faults)} injected); settling")
        self.run_due(everything=True)  # SIGCONT, restarts, resumes
        self.check_daemons()
        for d in self.daemons:
            if d.state == "terminating":
                assert d.proc is not None
                d.proc.wait(30)
        self.check_daemons()
        self.unschedule()
        self.settle()

    def unschedule(self) -> None:
        """Take the schedule out of the config and reload every daemon, so that no tick
        fires a job while the soak settles (a removed schedule stops firing)."""
        config = self.workdir / "chaos.toml"
        config.write_text(config.read_text().replace(SCHEDULE, ""))
        live = [d for d in self.daemons if d.state == "up" and d.proc is not None]
        before = {d.tag: d.log_path.read_text(errors="replace").count("reloaded ") for d in live}
        for d in live:
            d.signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
            d.log_path.read_text(errors="replace").count("reloaded ") <= before[d.tag] for d in live
        ):
            time.sleep(0.1)

    def settle(self) -> None:
        deadline = time.monotonic() + self.args.settle
        query = (
            f"SELECT count(*) FROM {SCHEMA}.jobs"
            " WHERE status IN ('pending', 'running', 'waiting', 'suspended')"
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                [(left,)] = conn.execute(query).fetchall()
                self.check_daemons()
                self.run_due()  # signals still to send
                self.sample()
                if left == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
        self.settled_in = self.args.settle - (deadline - time.monotonic())
        codes = {d.tag: d.stop() for d in self.daemons}
        # Every attempt has ended: nothing a handler started may be alive (the daemons
        # are gone too, so a job child's leftovers would be orphans of init by now).
        # (a process killed in the daemons' last moments may still be dying: left behind
        # means alive a few seconds later, not mid-exit)
        give_up = time.monotonic() + 5.0
        while (left_behind := marked_processes()) and time.monotonic() < give_up:
            time.sleep(0.1)
        self.left_behind = left_behind
        for tag, code in codes.items():
            if code not in (0, None):
                self.daemons[int(tag[1:])].unexpected_exits.append(f"final SIGTERM exit {code}")

    # -- checks --------------------------------------------------------------------------

    def report(self) -> bool:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            # (payload and other odd values of the poison rows are never loaded here)
            everything = conn.execute(
                f"SELECT id, status::text, attempts, max_attempts, result,"
                f" (payload->>'raise')::float8 >= 1.0 AS doomed, last_error, handler,"
                f" concurrency_key FROM {SCHEMA}.jobs"
            ).fetchall()
            scheduled = {
                r[0]
                for r in conn.execute(
                    f"SELECT id FROM {SCHEMA}.jobs WHERE payload ? 'scheduled'"
                ).fetchall()
            }
            runs_of_ticks = conn.execute(
                f"SELECT tick, job_id, extract(epoch FROM fired_at - tick)::float8"
                f" FROM {SCHEMA}.schedule_runs ORDER BY tick"
            ).fetchall()
            issue24 = self.issue24_rows(conn)
            shared_jobs = {
                r[0]: (r[1], r[2])
                for r in conn.execute(
                    f"SELECT id, concurrency_key, extract(epoch FROM created_at)::float8"
                    f" FROM {SCHEMA}.jobs WHERE handler = 'shared'"
                ).fetchall()
            }
            # every start: the attempts' history and each job's last start
            shared_starts = conn.execute(
                f"SELECT extract(epoch FROM started_at)::float8, job_id FROM {SCHEMA}.attempts"
                f" WHERE job_id = ANY(%s) AND started_at IS NOT NULL"
                f" UNION SELECT extract(epoch FROM started_at)::float8, id FROM {SCHEMA}.jobs"
                f" WHERE id = ANY(%s) AND started_at IS NOT NULL",
                [list(shared_jobs), list(shared_jobs)],
            ).fetchall()
            deduped = conn.execute(
                f"SELECT id, dedupe_key, extract(epoch FROM created_at)::float8,"
                f" extract(epoch FROM finished_at)::float8 FROM {SCHEMA}.jobs"
                f" WHERE handler = 'deduped'"
            ).fetchall()
            rated_starts = conn.execute(
                f"SELECT extract(epoch FROM a.started_at)::float8, j.concurrency_key"
                f" FROM {SCHEMA}.attempts a JOIN {SCHEMA}.jobs j ON j.id = a.job_id"
                f" WHERE j.handler = 'rated' AND a.started_at IS NOT NULL"
            ).fetchall()
        rows = [r[:5] for r in everything if r[0] not in self.poison]
        doomed = {r[0] for r in everything if r[5]}
        poison_rows = {r[0]: r for r in everything if r[0] in self.poison}
        jobs_by_id = {r[0]: r for r in rows}
        # executions: (job, pid) -> start, last seen, end event, attempt, tag
        ex: dict[tuple[int, int], dict[str, Any]] = {}
        for text in self.execs.read_text().splitlines():
            line = json.loads(text)
            e = ex.setdefault(
                (line["j"], line["pid"]),
                {"job": line["j"], "attempt": line["a"], "tag": line["tag"], "pid": line["pid"]}
                | {"start": line["t"], "last": line["t"], "end": None, "seen": [], "wait": None},
            )
            e["last"] = max(e["last"], line["t"])
            if line["e"] in ("done", "raise", "crash", "interrupted"):
                e["end"] = line["e"]
            elif line["e"] == "seen":  # a waiter's signal payload, as its handler saw it
                e["seen"].append((line["t"], line["payload"]))
            elif line["e"] == "wait":  # a waiter raised WaitFor
                e["wait"] = line["t"]
        per_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in ex.values():
            per_job[e["job"]].append(e)
        for runs in per_job.values():
            runs.sort(key=lambda e: e["start"])

        accepted: Counter[int] = Counter()
        fenced = 0
        crashed = 0
        for d in self.daemons:
            text = d.log_path.read_text(errors="replace")
            accepted.update(
                int(m) for m in re.findall(r"job (\d+) \S+ attempt \d+: completed in", text)
            )
            fenced += len(re.findall(r"\(fenced off\)", text))
            crashed += len(re.findall(r"daemon crashed|Traceback \(most recent", text))

        failures: list[str] = []
        statuses = Counter(r[1] for r in rows)
        overlaps = []
        for job_id, runs in per_job.items():
            for i, later in enumerate(runs):
                overlaps += [(job_id, a, later) for a in runs[:i] if later["start"] < a["last"]]
        lost = [r[0] for r in rows if r[1] not in ("completed", "dead")]
        twice = [j for j, n in accepted.items() if n > 1]
        bad_result, bad_attempts, dead_accepted = [], [], []
        redone = 0
        for job_id, status, attempts, max_attempts, result in rows:
            runs = per_job.get(job_id, [])
            if any(e["attempt"] > attempts for e in runs) or attempts > max_attempts:
                bad_attempts.append(job_id)
            if status == "completed":
                match = [e for e in runs if e["pid"] == result["pid"] and e["end"] == "done"]
                if len(match) != 1 or result["attempt"] != attempts:
                    bad_result.append(job_id)
                redone += sum(1 for e in runs if e["end"] == "done") - 1
            elif status == "dead":
                if attempts != max_attempts:
                    bad_attempts.append(job_id)
                if accepted[job_id]:
                    dead_accepted.append(job_id)
        # Only the doomed jobs (which fail every attempt) may end dead: a poison row must
        # not cost a job claimed beside it its attempts.
        innocent_dead = [r[0] for r in rows if r[1] == "dead" and r[0] not in doomed]
        # The limits: executions of "limited" jobs at once, in all and per key (an
        # execution spans its start to its last sign of life).
        limited_key = {r[0]: r[8] for r in everything if r[7] == "limited"}
        over_rate = _over_rate([t for t, _ in rated_starts], RATED_PER_SECOND)
        for key in RATED_KEYS:
            over_rate += _over_rate([t for t, k in rated_starts if k == key], RATED_PER_KEY)
        limited_runs = [e for e in ex.values() if e["job"] in limited_key]
        over_limit = _over(limited_runs, LIMITED_RUNNING)
        for key in LIMITED_KEYS:
            of_key = [e for e in limited_runs if limited_key[e["job"]] == key]
            over_limit += _over(of_key, LIMITED_PER_KEY)
        share_windows, unfair = fair_share_breaches(
            shared_jobs, shared_starts, SHARED_WEIGHTS, SHARE_WINDOW, SHARE_BOUND
        )
        idle = idle_slots(self.samples, SLOTS, IDLE_GRACE, self.pg_restarted_at)
        idle_looked = sum(
            1 for s in self.samples for since, _ in s.daemons.values() if since <= s.at - IDLE_GRACE
        )
        dedupe_broken = dedupe_breaches(deduped, DEDUPE_WINDOW)
        poison_not_buried = [
            (job_id, kind)
            for job_id, kind in self.poison.items()
            if job_id not in poison_rows
            or poison_rows[job_id][1] != "dead"
            or "cannot" not in (poison_rows[job_id][6] or "")
        ]
        poison_ran = [j for j in self.poison if j in per_job]
        unexpected = [f"{d.tag}: {x}" for d in self.daemons for x in d.unexpected_exits]
        missing = [j for j in self.ids if j not in jobs_by_id]
        i24 = self.issue24_checks(issue24, {r[0]: r for r in everything}, per_job)
        # a child whose parent did not complete is cancelled; an expiring job that did
        # not run in time is cancelled as expired: neither is lost
        lost = [j for j in lost if j not in i24.cancelled_rightly]

        # time from a fault to each affected job's next start; a job is affected when its
        # execution in flight at the fault was killed or released, or finished but its
        # outcome was lost (it ran again); a failure of its own (raise, crash) is a retry
        recovery: dict[str, list[float]] = defaultdict(list)
        for f in self.faults:
            for job_id in f.jobs:
                runs = per_job.get(job_id, [])
                hit = [e for e in runs if e["start"] <= f.at <= e["last"] + 0.5]
                if hit and hit[-1]["end"] in ("raise", "crash"):
                    continue
                nxt = [e["start"] for e in runs if e["start"] > f.at]
                if nxt:
                    recovery[f.kind].append(min(nxt) - f.at)

        # one job per tick: every scheduled job belongs to exactly one run, and back
        # to back late runs would be a catch-up burst
        tick_jobs = Counter(r[1] for r in runs_of_ticks if r[1] is not None)
        not_one_tick = sorted(
            {j for j in scheduled if tick_jobs[j] != 1} | (set(tick_jobs) - scheduled)
        )
        late = [r[0] for r in runs_of_ticks if r[2] > SCHEDULE_LATE]
        bursts = [t for t in late if t - timedelta(seconds=1) in set(late)]
        tick_seconds = [int(r[0].timestamp()) for r in runs_of_ticks]
        gaps = sum(b - a - 1 for a, b in itertools.pairwise(tick_seconds))

        def pct(values: list[float], p: float) -> float:
            s = sorted(values)
            return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]

        n_exec = len(ex)
        out = [
            "=== chaos soak summary ===",
            f"seed {self.args.seed}; {len(self.daemons)} daemons x {WORKER['slots']} slots, "
            f"lease {WORKER['lease']}, renew {WORKER['renew_interval']}; "
            f"faults for {self.args.duration:.0f}s, settled in {self.settled_in:.1f}s",
            f"jobs: {len(rows)} total; "
            + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items()))
            + f"; plus {len(self.poison)} poison rows: "
            + ", ".join(f"{k} {n}" for k, n in sorted(Counter(self.poison.values()).items())),
            f"faults injected: {len(self.faults)}; "
            + ", ".join(
                f"{k} {n}" for k, n in sorted(Counter(f.kind for f in self.faults).items())
            ),
            f"executions: {n_exec} ({n_exec / max(1, len(rows)):.2f} per job); per job: "
            + ", ".join(
                f"{k}x {n}" for k, n in sorted(Counter(len(r) for r in per_job.values()).items())
            ),
            "execution ends: "
            + ", ".join(
                f"{k} {n}"
                for k, n in sorted(Counter(str(e["end"] or "killed") for e in ex.values()).items())
            ),
            f"attempts: {sum(r[2] for r in rows)} claimed in total; "
            f"{sum(r[2] for r in rows) - len({(e['job'], e['attempt']) for e in ex.values()})} "
            "claimed attempts never started (e.g. parent killed before dispatch)",
            f"late outcomes fenced off: {fenced}; finished executions run again because "
            f"their outcome was lost to a fault: {redone}",
            f"schedule (1 s, fired by all daemons): {len(runs_of_ticks)} ticks, "
            f"{len(scheduled)} jobs, {len(late)} caught up late, {gaps} ticks missed "
            "(caught up by the catch-up rule)",
            i24.summary,
            f"fair share (handler shared, weights {SHARED_WEIGHTS}, max_running "
            f"{SHARED_RUNNING}): {len(shared_jobs)} jobs, {len(shared_starts)} starts, "
            f"{share_windows} windows of {SHARE_WINDOW} starts with every key due",
            f"slots sampled every {IDLE_SAMPLE}s: {len(self.samples)} samples, "
            f"{idle_looked} looks at a daemon up for {IDLE_GRACE}s or more, "
            f"{sum(1 for s in self.samples if s.due)} samples with chaos jobs due",
            f"dedupe (window {DEDUPE_WINDOW}s, keys {len(DEDUPE_KEYS)}): {len(deduped)} jobs; "
            "calls " + ", ".join(f"{k} {n}" for k, n in sorted(self.dedupe_calls.items())),
            "time from a fault to the affected job running again (queueing included):",
        ]
        everything = [v for vs in recovery.values() for v in vs]
        for kind, values in [*sorted(recovery.items()), ("all", everything)]:
            if values:
                out.append(
                    f"  {kind:<24} n={len(values):<4} p50 {pct(values, 50):6.2f}s  "
                    f"p99 {pct(values, 99):6.2f}s  max {max(values):6.2f}s"
                )
        checks = [
            ("overlapping executions of one job", len(overlaps), overlaps[:3]),
            (
                "lost or stuck jobs (not completed/dead)",
                len(lost) + len(missing),
                (lost + missing)[:10],
            ),
            ("completions accepted more than once", len(twice), twice[:10]),
            (
                "completed jobs whose result is not one finished execution of the last attempt",
                len(bad_result),
                bad_result[:10],
            ),
            ("dead jobs with an accepted completion", len(dead_accepted), dead_accepted[:10]),
            ("attempts not accounted for", len(bad_attempts), bad_attempts[:10]),
            ("jobs dead that were not doomed to fail", len(innocent_dead), innocent_dead[:10]),
            (
                f"instants with more limited executions than max_running {LIMITED_RUNNING}"
                f" or max_running_per_key {LIMITED_PER_KEY} ({len(limited_runs)} executions)",
                len(over_limit),
                over_limit[:3],
            ),
            (
                f"seconds with more starts of the rated handler than {RATED_PER_SECOND}, or of"
                f" one key than {RATED_PER_KEY} ({len(rated_starts)} starts)",
                len(over_rate),
                over_rate[:3],
            ),
            (
                f"windows of {SHARE_WINDOW} starts where a key's share of the fair handler's"
                f" starts is more than {SHARE_BOUND} from its weight's ({share_windows} windows)",
                len(unfair),
                unfair[:3],
            ),
            (
                f"stretches of {IDLE_GRACE}s or more with a slot idle while a job was due",
                len(idle),
                idle[:3],
            ),
            (
                f"dedupe keys held twice within their window ({len(deduped)} jobs)",
                len(dedupe_broken),
                dedupe_broken[:5],
            ),
            (
                f"poison jobs ({len(self.poison)} enqueued) not dead with the reason",
                len(poison_not_buried),
                poison_not_buried[:10],
            ),
            ("poison jobs that reached a handler", len(poison_ran), poison_ran[:10]),
            ("scheduled jobs without exactly one tick", len(not_one_tick), not_one_tick[:10]),
            ("late schedule runs back to back (catch-up bursts)", len(bursts), bursts[:5]),
            *i24.checks,
            ("daemon crashes or tracebacks in logs", crashed, []),
            ("daemons that exited on their own", len(unexpected), unexpected[:5]),
            ("handler subprocesses left behind", len(self.left_behind), self.left_behind[:5]),
        ]
        out.append("invariants:")
        for what, n, examples in checks:
            out.append(
                f"  {what}: {n}"
                + (f"  e.g. {examples}" if n else "")
                + ("" if n == 0 else "  <-- FAIL")
            )
            if n:
                failures.append(what)
        out += [f"note: {n}" for n in self.notes]
        out.append("RESULT: " + ("OK" if not failures else "FAILED: " + "; ".join(failures)))
        print("\n".join(out), flush=True)
        return not failures

    def issue24_rows(self, conn: psycopg.Connection) -> dict[str, list[tuple[Any, ...]]]:
        """What the invariants of issue 24's features read (the poison rows left out)."""
        s = SCHEMA
        queries = {
            # child, parent, the parent's status and finish, the child's on_parent_failure
            "parents": f"SELECT p.child_id, p.parent_id, pj.status::text, pj.finished_at,"
            f" cj.on_parent_failure FROM {s}.job_parents p"
            f" JOIN {s}.jobs pj ON pj.id = p.parent_id JOIN {s}.jobs cj ON cj.id = p.child_id",
            "fan_outs": f"SELECT id, (payload->>'then')::int FROM {s}.jobs WHERE payload ? 'then'",
            "follow_ups": f"SELECT id, (payload->>'follow_up_of')::bigint, (payload->>'n')::int"
            f" FROM {s}.jobs WHERE payload ? 'follow_up_of'",
            "follow_up_rows": f"SELECT job_id, follow_up_id FROM {s}.job_follow_ups",
            # each waiter and its correlation key (None: signalled by id)
            "waiters": f"SELECT id, payload->>'key' FROM {s}.jobs WHERE handler = 'waiter'",
            "signals": f"SELECT job_id, payload FROM {s}.signals",
            # signals by key never handed to a job
            "parked_left": f"SELECT wait_key FROM {s}.parked_signals",
            "suspended_with_signal": f"SELECT j.id FROM {s}.jobs j JOIN {s}.signals g"
            " ON g.job_id = j.id AND g.name = j.wait_for WHERE j.status = 'suspended'",
            # each expiring job, its handler, and whether it was never claimed at all
            "expiring": f"SELECT j.id, j.expires_at, j.handler, j.started_at IS NULL"
            f" AND j.attempts = 0 AND NOT EXISTS (SELECT FROM {s}.attempts a"
            f" WHERE a.job_id = j.id) FROM {s}.jobs j WHERE j.expires_at IS NOT NULL",
            # every claim of an expiring job at or after its deadline: the attempts'
            # history, and the job's own last start (an attempt still to be recorded)
            "started_expired": f"SELECT a.job_id, a.attempt, a.started_at FROM {s}.attempts a"
            f" JOIN {s}.jobs j ON j.id = a.job_id WHERE a.started_at >= j.expires_at"
            f" UNION ALL SELECT id, attempts, started_at FROM {s}.jobs"
            " WHERE started_at >= expires_at",
        }
        return {name: conn.execute(q).fetchall() for name, q in queries.items()}

    def issue24_checks(
        self,
        found: dict[str, list[tuple[Any, ...]]],
        jobs: dict[int, tuple[Any, ...]],
        per_job: dict[int, list[dict[str, Any]]],
    ) -> Issue24:
        """Dependencies, follow-ups, signals and deadlines under the faults."""
        out = Issue24()
        status = {j: r[1] for j, r in jobs.items()}
        error = {j: r[6] or "" for j, r in jobs.items()}
        # no child started before all its parents completed; none ran whose parent did not
        # (with on_parent_failure "run": none started before all its parents finished,
        # whatever their end)
        parents: dict[int, list[tuple[int, str, Any]]] = defaultdict(list)
        policy: dict[int, str] = {}
        for child, parent, parent_status, finished_at, on_failure in found["parents"]:
            parents[child].append((parent, parent_status, finished_at))
            policy[child] = on_failure
        early = []
        for child, of_child in parents.items():
            runs = per_job.get(child, [])
            failed = [p for p, st, _ in of_child if st != "completed"]
            if failed and status[child] == "cancelled" and "parent" in error[child]:
                out.cancelled_rightly.add(child)
            if not runs:
                continue
            first = runs[0]["start"]
            unfinished = [p for p, _, at in of_child if at is None or at.timestamp() > first]
            if unfinished or (failed and policy[child] != "run"):
                early.append((child, policy[child], [(p, st) for p, st, _ in of_child]))
        # each follow-up exactly once: a completed fan-out's n of them, 0..n-1 once each
        # and listed in job_follow_ups; none for a fan-out that did not complete
        of_fan_out: dict[int, list[int]] = defaultdict(list)
        ids_of: dict[int, set[int]] = defaultdict(set)
        for job_id, fan_out, n in found["follow_ups"]:
            of_fan_out[fan_out].append(n)
            ids_of[fan_out].add(job_id)
        listed: dict[int, set[int]] = defaultdict(set)
        for fan_out, follow_up in found["follow_up_rows"]:
            listed[fan_out].add(follow_up)
        not_once = []
        for fan_out, n in found["fan_outs"]:
            want = list(range(n)) if status.get(fan_out) == "completed" else []
            if sorted(of_fan_out[fan_out]) != want or listed[fan_out] != ids_of[fan_out]:
                not_once.append((fan_out, n, sorted(of_fan_out[fan_out])))
        # no signal lost: every waiter signalled once, resumed, and saw its signal (by
        # key, a signal sent before the wait is parked, then handed over by the WaitFor)
        stored: dict[int, list[Any]] = defaultdict(list)
        for job_id, payload in found["signals"]:
            stored[job_id].append(payload)
        keys = {waiter: key for waiter, key in found["waiters"]}
        lost_signals = []
        for waiter, key in keys.items():
            token, outcome = self.signals.get(waiter, (None, "never sent"))
            result = jobs[waiter][4]
            seen = result.get("signal") if isinstance(result, dict) else None
            if (
                outcome not in (("kept", "resumed") if key is None else BY_KEY_DELIVERED)
                or status[waiter] != "completed"
                or seen != {"token": token}
                or stored.get(waiter) != [{"token": token}]
            ):
                lost_signals.append((waiter, outcome, status[waiter], seen))
        left_suspended = [r[0] for r in found["suspended_with_signal"]]
        # a signal by key sent before the wait, seen exactly once: handed over once (one
        # signal row, nothing left parked under the key), every execution after the wait
        # saw that payload (never none, never another), and none waited again after one
        # had seen it (a signal consumed and forgotten)
        parked_left = Counter(key for (key,) in found["parked_left"])
        not_once_by_key = []
        for waiter, key in keys.items():
            if key is None:
                continue
            token, _ = self.signals.get(waiter, (None, "never sent"))
            runs = per_job.get(waiter, [])
            seen_at = [(t, seen) for e in runs for t, seen in e.get("seen", [])]
            first_seen = min((t for t, _ in seen_at), default=None)
            waited_after = [
                e["wait"]
                for e in runs
                if e.get("wait") is not None and first_seen is not None and e["wait"] > first_seen
            ]
            if (
                parked_left[key]
                or len(stored.get(waiter, [])) != 1
                or not seen_at
                or any(seen != {"token": token} for _, seen in seen_at)
                or waited_after
            ):
                not_once_by_key.append(
                    (waiter, key, parked_left[key], [seen for _, seen in seen_at], waited_after)
                )
        # no expired job started; an expiring job not completed ended cancelled as expired;
        # one never claimed ended so whatever its handler (the sweep's work when no claim
        # reaches it: no daemon serves it, or its one slot is busy) and reached no handler
        started_expired = [(r[0], r[1], str(r[2])) for r in found["started_expired"]]
        expired = 0
        never_ended = []
        for job_id, _, handler, never_started in found["expiring"]:
            ended_expired = status[job_id] == "cancelled" and error[job_id].startswith("expired:")
            if ended_expired:
                out.cancelled_rightly.add(job_id)
                expired += 1
            ran = len(per_job.get(job_id, []))  # executions: none for a job never claimed
            if never_started and (not ended_expired or ran):
                never_ended.append((job_id, handler, status[job_id], error[job_id][:60], ran))
        by_id = Counter(o for w, (_, o) in self.signals.items() if keys.get(w) is None)
        by_key = Counter(o for w, (_, o) in self.signals.items() if keys.get(w) is not None)
        of_handler = Counter(r[2] for r in found["expiring"])
        failed_parent = Counter(
            policy[c] for c, ps in parents.items() if any(st != "completed" for _, st, _ in ps)
        )
        out.summary = (
            f"issue 24 workload: {len(parents)} children of "
            f"{sum(len(v) for v in parents.values())} parents ({failed_parent.total()} of a"
            " parent that failed: "
            + ", ".join(f"{k} {n}" for k, n in sorted(failed_parent.items()))
            + f"); {len(found['fan_outs'])} fan-outs"
            f" with {len(found['follow_ups'])} follow-ups; "
            f"{sum(1 for k in keys.values() if k is None)} waits, signals "
            + ", ".join(f"{k} {n}" for k, n in sorted(by_id.items()))
            + f"; {sum(1 for k in keys.values() if k is not None)} waits by key, signals "
            + ", ".join(f"{k} {n}" for k, n in sorted(by_key.items()))
            + f"; {len(found['expiring'])} expiring jobs ({of_handler[UNSERVED]} no daemon"
            f" serves, {of_handler['narrow']} of a one-slot handler), {expired} of them expired"
            f" ({sum(1 for r in found['expiring'] if r[3])} never started)"
        )
        out.checks = [
            ("children started before all their parents completed", len(early), early[:5]),
            ("fan-outs whose follow-ups are not there exactly once", len(not_once), not_once[:5]),
            (
                "signals lost (a signalled wait not resumed by it)",
                len(lost_signals),
                lost_signals[:5],
            ),
            (
                "jobs left suspended with their signal there",
                len(left_suspended),
                left_suspended[:5],
            ),
            (
                "signals by key not seen exactly once by their job",
                len(not_once_by_key),
                not_once_by_key[:5],
            ),
            (
                "expired jobs started (claimed at or after expires_at)",
                len(started_expired),
                started_expired[:5],
            ),
            (
                "expiring jobs never started not ended cancelled as expired",
                len(never_ended),
                never_ended[:5],
            ),
        ]
        return out

    def cleanup(self) -> None:
        if self.look_conn is not None:
            self.look_conn.close()
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait(10)
        for pid in marked_processes():  # what a failed containment left: this run's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not self.args.keep:
            self.pg.cleanup()


@dataclass
class Issue24:
    """The invariants of issue 24's features: (what, how many, examples) each."""

    checks: list[tuple[str, int, list[Any]]] = field(default_factory=list)
    summary: str = ""
    # cancelled as they should be (a parent failed; expired): not lost
    cancelled_rightly: set[int] = field(default_factory=set)


# argv[0] of the processes the handlers start (chaos_handlers.py): unique to this run.
MARKER = f"pgworkerd-chaos-leftover-{os.getpid()}"


def marked_processes() -> list[int]:
    """The live processes named MARKER, found by walking /proc (not asking a daemon)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if argv0 == MARKER.encode() and state not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def inline_table(values: dict[str, int]) -> str:
    return "{ " + ", ".join(f"{json.dumps(k)} = {v}" for k, v in values.items()) + " }"


@dataclass
class Sample:
    """One look at the fleet (for "no slot idles while work is due")."""

    at: float  # time.time()
    daemons: dict[str, tuple[float, int]]  # worker id of each daemon up -> (up since, running)
    due: set[int]  # jobs of handler "chaos" pending with run_at passed


def idle_slots(
    samples: list[Sample], slots: int, grace: float, quiet: list[float]
) -> list[tuple[str, float, float, int]]:
    """The stretches of samples, at least `grace` s long, through which a daemon up for
    `grace` s had fewer running jobs than `slots` while a job was due, one due at the
    first sample still pending at the last: (worker, from, to, running at the end).
    Samples within 2 x grace after a time of `quiet` (PostgreSQL restarts) do not count."""
    found = []
    for worker in sorted({w for s in samples for w in s.daemons}):
        first: Sample | None = None
        for s in samples:
            up_since, running = s.daemons.get(worker, (s.at, slots))
            idle = (
                up_since <= s.at - grace
                and running < slots
                and bool(s.due)
                and not any(q - IDLE_SAMPLE <= s.at <= q + 2 * grace for q in quiet)
            )
            if not idle:
                first = None
            elif first is None:
                first = s
            elif s.at - first.at >= grace and first.due & s.due:
                found.append((worker, first.at, s.at, running))
                first = None  # a stretch is counted once; a longer one again
    return found


def fair_share_breaches(
    jobs: dict[int, tuple[str, float]],
    starts: list[tuple[float, int]],
    weights: dict[str, int],
    window: int,
    bound: float,
) -> tuple[int, list[tuple[float, dict[str, int]]]]:
    """Of `jobs` (id -> (key, created)) and every start of them (time, id): the windows
    of `window` consecutive starts at every one of which each key had a job due (created,
    its first start not before), and of those the ones where a key's starts are more than
    `bound` from window x its share of `weights`: (windows looked at, [(time, starts per
    key)])."""
    starts = sorted(starts)
    first: dict[int, float] = {}
    for t, job_id in starts:
        first.setdefault(job_id, t)
    never = float("inf")

    def due(key: str, t: float) -> bool:
        return any(
            k == key and created <= t and first.get(j, never) >= t
            for j, (k, created) in jobs.items()
        )

    all_due = [all(due(k, t) for k in weights) for t, _ in starts]
    total = sum(weights.values())
    looked, breaches = 0, []
    for i in range(len(starts) - window + 1):
        if not all(all_due[i : i + window]):
            continue
        looked += 1
        n = Counter(jobs[j][0] for _, j in starts[i : i + window])
        if any(abs(n[k] - window * w / total) > bound for k, w in weights.items()):
            breaches.append((starts[i][0], {k: n[k] for k in weights}))
    return looked, breaches


def dedupe_breaches(
    rows: list[tuple[int, str, float, float | None]], window: float
) -> list[tuple[str, int, int]]:
    """Of jobs (id, dedupe key, created, finished) of one handler, each pair of one key
    where the later was created before the earlier finished + `window`: (key, earlier,
    later). Consecutive pairs suffice: a breach with a job between breaches with it too."""
    by_key: dict[str, list[tuple[float, int, float | None]]] = defaultdict(list)
    for job_id, key, created, finished in rows:
        by_key[key].append((created, job_id, finished))
    found = []
    for key, held in sorted(by_key.items()):
        held.sort()
        for (_, a, finished), (created, b, _) in itertools.pairwise(held):
            if finished is None or created < finished + window:
                found.append((key, a, b))
    return found


def _over_rate(times: list[float], limit: int) -> list[tuple[float, int]]:
    """The windows [t, t + 1 s) holding more than `limit` starts: (t, how many)."""
    times = sorted(times)
    over = []
    j = 0
    for i, t in enumerate(times):
        while times[j] <= t - 1.0:
            j += 1
        if i - j + 1 > limit:
            over.append((times[j], i - j + 1))
    return over


def _over(runs: list[dict[str, Any]], limit: int) -> list[tuple[float, list[int]]]:
    """The starts at which more than `limit` of `runs` were running (time, jobs)."""
    found = []
    for e in runs:
        at_once = [o for o in runs if o["start"] <= e["start"] < o["last"] or o is e]
        if len(at_once) > limit:
            found.append((e["start"], sorted(o["job"] for o in at_once)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="~1 minute, 800 jobs (CI)")
    parser.add_argument("--jobs", type=int, help="jobs in total (default 5000; short 800)")
    parser.add_argument("--duration", type=float, help="seconds of faults (600; short 40)")
    parser.add_argument("--settle", type=float, help="seconds allowed to settle (300; short 60)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--pg-restarts", type=int, help="PostgreSQL restarts at most (20; short 2)")
    parser.add_argument("--workdir", type=Path, help="keep logs and executions here")
    parser.add_argument("--keep", action="store_true", help="keep the cluster (in the workdir)")
    a = parser.parse_args()
    a.jobs = a.jobs or (800 if a.short else 5000)
    a.duration = a.duration or (40.0 if a.short else 600.0)
    a.settle = a.settle or (60.0 if a.short else 300.0)
    a.pg_restarts = a.pg_restarts if a.pg_restarts is not None else (2 if a.short else 20)
    a.seed = a.seed if a.seed is not None else random.randrange(1_000_000)
    a.fault_interval = (0.7, 2.0)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="pgworkerd-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"seed {a.seed}; workdir {workdir}")
    soak = Soak(a, workdir)
    ok = False
    try:
        soak.setup()
        soak.run()
        ok = soak.report()
    finally:
        soak.cleanup()
        if a.workdir is None and ok:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            log(f"logs kept in {workdir}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
