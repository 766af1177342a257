"""What claim_jobs (migration 0019: argument checks, a durable commit, then claim_v3) adds
to each claim over calling claim_v3 directly, as daemons of schemas 9 to 18 did.

    .venv/bin/python bench/claim_jobs_bench.py [--short]

Measured on the server alone (a DO block calling the function in a loop, so neither the
client nor the network is in the figure), on an empty queue, for a claim of two handlers
with every optional argument given, as the daemon sends them: that is the fixed cost of
a claim, the part the wrapper could change. The two functions alternate round by round;
the minimum over rounds is the figure least disturbed by other work on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics

import psycopg
from _measure import server_us_per_call

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

ARGS = (
    "('bench-worker', '{default,mail}', '{h1,h2}', '{60,60}', '{4,4}', 8,"
    " '{NULL,NULL}', '[null,null]', '{NULL,NULL}', '{NULL,NULL}')"
)
FUNCTIONS = ("claim_v3", "claim_jobs")


def per_call_us(conn: psycopg.Connection, function: str, calls: int) -> float:
    return server_us_per_call(conn, f"PERFORM * FROM pgworkerd.{function}{ARGS};", calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    args = parser.parse_args()
    calls, rounds = (300, 4) if args.short else (3000, 12)
    with LocalPostgres() as pg:
        pg.create_database("bench")
        migrate(pg.dsn("bench"))
        with psycopg.connect(pg.dsn("bench"), autocommit=True) as conn:
            samples: dict[str, list[float]] = {f: [] for f in FUNCTIONS}
            for n in range(rounds):
                for function in FUNCTIONS if n % 2 == 0 else FUNCTIONS[::-1]:
                    samples[function].append(per_call_us(conn, function, calls))
    print(f"claim of 2 handlers on an empty queue, server side, {rounds} rounds of {calls}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for function, values in samples.items():
        print(
            f"  {function:<10}  min {min(values):7.0f} us   median"
            f" {statistics.median(values):7.0f} us per call"
        )
    added = min(samples["claim_jobs"]) - min(samples["claim_v3"])
    print(f"  claim_jobs adds {added:+.0f} us per claim (min against min)")


if __name__ == "__main__":
    main()
