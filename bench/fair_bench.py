"""Fair share and start-rate limits (claim_v4, migration 0033; issue 25): what fairness
costs a claim, where it starts the late keys, and the rate it achieves against its limit.

    .venv/bin/python bench/fair_bench.py [--short]

1. Throughput: claims of 4 jobs of one handler, fair (fair => true) against unfair
   (claim_v3's order through claim_v4 with no fairness), on identical backlogs of 10,
   1,000 and 10,000 keys (same run, the two alternating), each claim its own transaction
   from a Python client on a private cluster (as the daemon claims: one round trip each).
2. Fairness: 1,000 jobs of key a, then 10 of each of 9 other keys; claims of one job until
   every key has started: the start position of each other key's first job, fair and FIFO.
3. Rate: 3 claimers (threads, one connection each) claim a handler limited to `rate`
   as fast as they can; one claimer's connection is terminated by the server mid-run (a
   crashed daemon: its claims so far committed, the rest never happen); the starts
   per window of the rate's unit, from the jobs' started_at, against the limit.
4. Rate with real daemons killed: 3 `pgworkerd run` daemons serve a handler limited to
   `rate = "20/m"` (short: "2/s"), a backlog always due; every 20 s (short: 5 s) one
   daemon is killed with SIGKILL and started again 1-3 s later. The starts per window of
   the rate's unit (attempts' started_at, rescues included) against the limit, and the
   starts per minute achieved while work was due. 10 minutes (short: 60 s).
   `--only daemons` runs this part alone.
5. Many keys (`--only keys`): N pending jobs of a fair handler, each with a key of its own
   (as an enqueuer spreading its jobs over N keys), N = 10,000, 1,000,000 and 10,000,000
   (short: 10,000 and 100,000; `--keys` chooses): the time per claim of 4 jobs (fair and
   unfair, each claim its own transaction) and what one fair claim reads (EXPLAIN ANALYZE
   BUFFERS of claim_v4: the buffers its statements touch). Bounded means flat in N.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import _measure  # bench/_measure.py (bench/ is on sys.path)
import psycopg

from pgworkerd.queue.migrate import migrate


def load(conn: psycopg.Connection, schema: str, keys: Sequence[str | None]) -> None:
    """One pending job of handler h per element of `keys`, in that order (ids ascending)."""
    with conn.cursor().copy(f"COPY {schema}.jobs (handler, concurrency_key) FROM STDIN") as cp:
        for key in keys:
            cp.write_row(("h", key))


def claim(
    conn: psycopg.Connection,
    schema: str,
    limit: int,
    *,
    fair: bool = False,
    rate: float | None = None,
    worker: str = "bench",
) -> list[str | None]:
    rows = conn.execute(
        # a lease longer than any run: no job is rescued (a rescue would start it again
        # and overwrite its started_at, which the rate's count reads)
        f"SELECT j.concurrency_key FROM {schema}.claim_v4(%s, '{{default}}', '{{h}}', "
        "'{86400}', %s, %s, fair => %s, rate => %s) AS c "
        f"JOIN {schema}.jobs j USING (id) ORDER BY c.id",
        [worker, [limit], limit, [fair], [rate]],
    ).fetchall()
    return [r[0] for r in rows]


def throughput(dsn: str, keys: int, jobs: int, claims: int) -> dict[str, float]:
    """Claims per second, fair and unfair, on two schemas holding the same backlog."""
    backlog = [f"customer:{n % keys:05}" for n in range(jobs)]
    rates: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for mode in ("unfair", "fair"):
            schema = f"b_{mode}_{keys}"
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            migrate(dsn, schema=schema)
            load(conn, schema, backlog)
            conn.execute(f"ANALYZE {schema}.jobs")
        for mode in ("unfair", "fair", "unfair", "fair"):  # alternating: load moves both
            schema = f"b_{mode}_{keys}"
            t = time.perf_counter()
            for _ in range(claims // 2):
                assert len(claim(conn, schema, 4, fair=mode == "fair")) == 4
            rates[mode] = rates.get(mode, 0.0) + (claims // 2) / (time.perf_counter() - t) / 2
        for mode in ("unfair", "fair"):
            conn.execute(f"DROP SCHEMA b_{mode}_{keys} CASCADE")
    return rates


def positions(dsn: str, fair: bool) -> dict[str, int]:
    """The start position (1-based) of each key's first job."""
    schema = "b_fair_order" if fair else "b_fifo_order"
    others = [f"k{n}" for n in range(1, 10)]
    first: dict[str, int] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        migrate(dsn, schema=schema)
        load(conn, schema, ["a"] * 1000 + [k for k in others for _ in range(10)])
        n = 0
        while len(first) < 10:
            (key,) = claim(conn, schema, 1, fair=fair)
            n += 1
            first.setdefault(str(key), n)
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return first


def most_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    most = j = 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


def rate_run(dsn: str, per_second: float, seconds: float) -> tuple[int, int, float]:
    """Starts in all, the most in any window (60 s for a long run, else 1 s), and the
    seconds the run took."""
    schema = "b_rate"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        migrate(dsn, schema=schema)
        load(conn, schema, [None] * int(per_second * seconds * 2 + 100))
    deadline = time.monotonic() + seconds
    pids: list[int] = []

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                pids.append(c.info.backend_pid)
                while time.monotonic() < deadline:
                    if not claim(c, schema, 4, rate=per_second, worker=f"w{n}"):
                        # as a daemon does: sleep until the next token, never spin
                        row = c.execute(
                            f"SELECT extract(epoch FROM min(next_at) - now())::float8"
                            f" FROM {schema}.rate_buckets WHERE next_at > now()"
                        ).fetchone()
                        wait = row[0] if row and row[0] is not None else 0.001
                        time.sleep(min(max(wait, 0.001), 1.0))
        except psycopg.OperationalError:
            pass  # the one whose connection was terminated: a crashed daemon

    pool = [threading.Thread(target=claimer, args=(n,)) for n in range(3)]
    t0 = time.monotonic()
    for t in pool:
        t.start()
    time.sleep(seconds / 3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
        for t in pool:
            t.join()
        elapsed = time.monotonic() - t0
        times = [
            float(r[0])
            for r in conn.execute(
                f"SELECT extract(epoch FROM started_at) FROM {schema}.jobs "
                "WHERE started_at IS NOT NULL"
            )
        ]
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    window = 60.0 if seconds >= 120 else 1.0
    return len(times), most_in_window(times, window), elapsed


def daemons_rate_run(dsn: str, short: bool) -> None:
    """Part 4: the rate across real daemons killed -9 and restarted."""
    import random
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    schema = "b_daemons"
    rate, per_second, seconds, every = (
        ("2/s", 2.0, 60.0, 5.0) if short else ("20/m", 1 / 3, 600.0, 20.0)
    )
    window = 1.0 if short else 60.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        migrate(dsn, schema=schema)
        # a backlog that lasts the run: always due
        conn.execute(
            f"INSERT INTO {schema}.jobs (handler) SELECT 'r' FROM generate_series(1, %s)",
            [int(per_second * seconds * 1.5) + 50],
        )
    work = Path(tempfile.mkdtemp(prefix="pgworkerd-fair-bench-"))
    config = work / "rate.toml"
    config.write_text(
        '[worker]\nname = "rate"\nslots = 4\nlease = "5s"\nrenew_interval = "1s"\n'
        'poll_interval = "1s"\n\n[handlers.r]\ntarget = "bench_handlers:noop"\n'
        f'rate = "{rate}"\n'
    )
    exe = str(Path(sys.executable).with_name("pgworkerd"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    env.pop("NOTIFY_SOCKET", None)

    def start(n: int) -> subprocess.Popen[bytes]:
        log = (work / f"d{n}.log").open("ab")
        return subprocess.Popen(
            [exe, "--dsn", dsn, "--schema", schema, "--config", str(config), "run"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    rng = random.Random(25)
    procs = [start(n) for n in range(3)]
    kills = 0
    t0 = time.time()
    try:
        while time.time() - t0 < seconds:
            time.sleep(every)
            n = rng.randrange(3)
            procs[n].send_signal(signal.SIGKILL)
            procs[n].wait(10)
            kills += 1
            time.sleep(rng.uniform(1.0, 3.0))
            procs[n] = start(n)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    t1 = time.time()
    with psycopg.connect(dsn, autocommit=True) as conn:
        times = sorted(
            float(r[0])
            for r in conn.execute(
                f"SELECT extract(epoch FROM started_at) FROM {schema}.attempts"
                f" WHERE started_at IS NOT NULL UNION ALL SELECT extract(epoch FROM started_at)"
                f" FROM {schema}.jobs j WHERE started_at IS NOT NULL AND NOT EXISTS ("
                f"SELECT 1 FROM {schema}.attempts a WHERE a.job_id = j.id"
                f" AND a.started_at = j.started_at)"
            )
        )
        [(left,)] = conn.execute(
            f"SELECT count(*) FROM {schema}.jobs WHERE status = 'pending'"
        ).fetchall()
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    inside = [t for t in times if t0 <= t <= t1]
    most = most_in_window(inside, window)
    limit = per_second * window
    per_minute = len(inside) / (t1 - t0) * 60
    print(
        f"4. rate {rate} ({per_second * 60:g}/min), 3 daemons, {kills} killed -9 and restarted"
        f" over {t1 - t0:.0f} s (backlog left: {left} jobs, always due): {len(inside)} starts,"
        f" {per_minute:.2f}/min = {per_minute / (per_second * 60):.1%} of the limit; most in"
        f" any {window:g} s window {most} (limit {limit:g})"
    )
    if not short:  # per minute of the run
        counts = [
            sum(1 for t in inside if t0 + 60 * m <= t < t0 + 60 * (m + 1))
            for m in range(int((t1 - t0) // 60))
        ]
        print(f"   starts in each whole minute of the run: {counts}")
    import shutil

    shutil.rmtree(work, ignore_errors=True)


def keys_run(dsn: str, keys: int, claims: int) -> None:
    """Part 5 for one N: `keys` jobs, one key each."""
    import json
    import statistics

    schema = "b_keys"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        migrate(dsn, schema=schema)
        t = time.perf_counter()
        conn.execute(
            f"INSERT INTO {schema}.jobs (handler, concurrency_key)"
            " SELECT 'h', 'tenant:' || g FROM generate_series(1, %s) g",
            [keys],
        )
        conn.execute(f"VACUUM ANALYZE {schema}.jobs")
        loaded = time.perf_counter() - t
        [(plan,)] = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM {schema}.claim_v4("
            "'w', '{default}', '{h}', '{86400}', '{4}', 4, fair => '{true}')"
        ).fetchall()
        top = (plan if isinstance(plan, list) else json.loads(plan))[0]
        node = top["Plan"]
        buffers = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        per: dict[str, list[float]] = {"unfair": [], "fair": []}
        for n in range(claims):
            for mode in ("unfair", "fair"):
                t = time.perf_counter()
                assert len(claim(conn, schema, 4, fair=mode == "fair", worker=f"w{n}")) == 4
                per[mode].append((time.perf_counter() - t) * 1000)
        conn.execute(f"DROP SCHEMA {schema} CASCADE")

    def ms(values: list[float]) -> str:
        values = sorted(values)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        return f"median {statistics.median(values):6.2f} ms, p95 {p95:6.2f} ms"

    print(
        f"   {keys:>10,} keys (loaded in {loaded:.0f} s): fair {ms(per['fair'])}; unfair "
        f"{ms(per['unfair'])}; one fair claim: {buffers} buffers,"
        f" {top['Execution Time']:.2f} ms (EXPLAIN ANALYZE)"
    )


def main() -> None:
    parser = _measure.arguments(__doc__, json_output=False)
    parser.add_argument(
        "--only", choices=("throughput", "order", "rate", "daemons", "keys"), help="one part"
    )
    parser.add_argument("--keys", type=int, nargs="+", help="N of part 5 (--only keys)")
    args = parser.parse_args()
    claims = 100 if args.short else 1000
    with _measure.server(settings={}) as (dsn, _):
        _measure.headline("fair share and start-rate", args.short)
        if args.only in (None, "throughput"):
            print(f"1. claims per second (4 jobs each, {claims} claims per mode), one handler:")
        for keys in (10, 1000, 10_000) if args.only in (None, "throughput") else ():
            jobs = max(20_000, 2 * keys) if not args.short else max(2_000, 2 * keys)
            r = throughput(dsn, keys, jobs, claims)
            print(
                f"   {keys:>6} keys, {jobs} jobs: unfair {r['unfair']:7.0f}/s   fair "
                f"{r['fair']:7.0f}/s   fair/unfair {r['fair'] / r['unfair']:.2f}"
            )
        if args.only in (None, "order"):
            print("2. 1,000 jobs of a, then 10 of each of k1..k9: start position of each first job")
        for fair in (False, True) if args.only in (None, "order") else ():
            first = positions(dsn, fair)
            others = sorted(v for k, v in first.items() if k != "a")
            print(f"   {'fair' if fair else 'FIFO'}: a {first['a']}, k1..k9 {others}")
        per_second, seconds = (5.0, 6.0) if args.short else (20 / 60, 600.0)
        if args.only == "keys":
            sizes = args.keys or (
                [10_000, 100_000] if args.short else [10_000, 1_000_000, 10_000_000]
            )
            print(
                f"5. claims of 4 with N keys of one job each ({min(claims, 200)} claims per mode;"
                " EXPLAIN of one fair claim first, on the fresh backlog):"
            )
            for keys in sizes:
                keys_run(dsn, keys, min(claims, 200))
            print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            return
        if args.only == "daemons":
            daemons_rate_run(dsn, args.short)
            return
        if args.only not in (None, "rate"):
            return
        total, most, elapsed = rate_run(dsn, per_second, seconds)
        window = 60.0 if seconds >= 120 else 1.0
        limit = per_second * window
        print(
            f"3. rate {per_second:g}/s, 3 claimers, one killed after {seconds / 3:.0f} s: "
            f"{total} starts in {elapsed:.1f} s ({total / elapsed:.3f}/s, "
            f"{total / elapsed / per_second:.1%} of the limit); most in any {window:g} s "
            f"window {most} (limit {limit:g})"
        )
        print(f"load average at the end: {_measure.load()}")


if __name__ == "__main__":
    main()
