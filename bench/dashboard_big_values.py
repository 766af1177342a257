"""A job page with a huge payload (the 2026-11-26 audit's N8): the page's size and time,
the dashboard process's peak RSS (VmHWM) before and after, and the raw download.

    .venv/bin/python bench/dashboard_big_values.py [--mb 30]

The dashboard runs as its own process (so its RSS is its own) on a private PostgreSQL;
the job's payload is jsonb_build_object('a', repeat('<x>', N)), as in the audit. A
benchmark, not a test: nothing is asserted. It runs against older code too (the server
is built without a login either way), to print the "before" figures.
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import sys
import time

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate

SERVER = """
import dataclasses, sys
from pgworkerd.config import WebConfig
from pgworkerd.web.server import build
fields = {f.name for f in dataclasses.fields(WebConfig)}
extra = {"allow_anonymous": True} if "allow_anonymous" in fields else {}
dashboard = build(WebConfig(port=0, **extra), sys.argv[1], sys.argv[2])
print(dashboard.server.effective_port, flush=True)
dashboard.run()
"""


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fetch(port: int, path: str) -> tuple[int, int, float]:
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = conn.getresponse()
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
        return response.status, size, time.monotonic() - began
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=30, help="payload size in MB")
    args = parser.parse_args()
    schema = "bench_big"
    with LocalPostgres() as pg:
        dsn = pg.dsn()
        migrate(dsn, schema=schema)
        with connect(dsn) as conn:
            [(job,)] = conn.execute(
                f"INSERT INTO {schema}.jobs (handler, payload) VALUES"
                " ('work', jsonb_build_object('a', repeat('<x>', %s))) RETURNING id",
                (args.mb * 1_000_000 // 3,),
            ).fetchall()
            conn.commit()
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, dsn, schema],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            fetch(port, "/jobs")  # warm: pool, templates
            before = peak_rss_mib(server.pid)
            status, size, seconds = fetch(port, f"/jobs/{job}")
            after = peak_rss_mib(server.pid)
            print(
                f"{args.mb} MB payload: GET /jobs/{job} -> {status}, {size:,} bytes in "
                f"{seconds:.2f} s; dashboard peak RSS {before:.0f} MiB before, {after:.0f} MiB "
                "after"
            )
            status, size, seconds = fetch(port, f"/jobs/{job}/raw/payload")
            print(
                f"raw download -> {status}, {size:,} bytes in {seconds:.2f} s; peak RSS "
                f"{peak_rss_mib(server.pid):.0f} MiB"
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
