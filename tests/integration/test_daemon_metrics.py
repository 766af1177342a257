"""The daemon's Prometheus endpoint, scraped while a real daemon runs real jobs."""

from __future__ import annotations

import itertools
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
from daemon_harness import Daemons, Db, wait_for

from pgworkerd import client
from pgworkerd.daemon.presence import HEARTBEAT_IDLE
from pgworkerd.ops import metrics

pytest.importorskip("prometheus_client")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match[1] or "") for k, v in labels.items()):
            return float(match[2])
    return None


def test_metrics_follow_the_jobs(db: Db, daemons: Daemons, tmp_path: Path) -> None:
    port = free_port()
    config = daemons.config(
        {
            "work": {"target": "jobhandlers:work"},
            "fail": {"target": "jobhandlers:fail", "max_attempts": 1},
        }
    )
    config.write_text(
        config.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        'queue_depth_interval = "1s"\n'
    )
    daemons.start(config)
    ok = db.enqueue("work", {"seconds": 0.1})
    bad = db.enqueue("fail")
    # a row the daemon cannot load (a JSON integer of 5,001 digits): refused at the claim
    db.rows("INSERT INTO {schema}.jobs (handler, payload) VALUES ('work', '{{\"x\": 1e5000}}')")
    db.wait_status(ok, "completed")
    db.wait_status(bad, "dead")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    def settled() -> str | None:
        text = scrape()
        done = sample(text, "pgworkerd_jobs_completed_total", handler="work")
        depth = sample(text, "pgworkerd_queue_jobs", queue="default", status="completed")
        dead = sample(text, "pgworkerd_queue_jobs", queue="default", status="dead")
        return text if done == 1 and depth == 1 and dead == 2 else None

    text = wait_for(settled, what="metrics to show the finished jobs")
    assert sample(text, "pgworkerd_jobs_claimed_total", handler="work") == 1
    assert sample(text, "pgworkerd_jobs_failed_total", handler="fail") == 1
    assert sample(text, "pgworkerd_jobs_refused_total", handler="work") == 1
    assert sample(text, "pgworkerd_queue_jobs", queue="default", status="dead") == 2
    assert sample(text, "pgworkerd_jobs_in_flight") == 0
    assert sample(text, "pgworkerd_draining") == 0
    assert (sample(text, "pgworkerd_job_start_latency_seconds_count") or 0) >= 2


def test_a_slow_job_count_does_not_stall_the_daemon(
    db: Db, daemons: Daemons, conn: psycopg.Connection, schema: str
) -> None:
    """Counting the jobs for the gauge takes seconds on a table of millions of rows: it
    runs beside the loop, which goes on heartbeating and claiming meanwhile. Here the
    count is held up by a lock on the job table instead."""
    port = free_port()
    config = daemons.config({"work": {"target": "jobhandlers:work"}}, {"poll_interval": "60s"})
    config.write_text(
        config.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        'queue_depth_interval = "1s"\n'
    )
    daemon = daemons.start(config)
    # Its first claim done (and no other due with a 60 s poll), only the count and the
    # heartbeats touch the database while the table is locked.
    db.wait_status(db.enqueue("work", {"seconds": 0.1}), "completed")
    age = (
        f'SELECT extract(epoch FROM clock_timestamp() - heartbeat_at) FROM "{schema}".workers'
        " WHERE id = %s"
    )

    with psycopg.connect(daemons.dsn) as locker:  # one transaction, held open below
        locker.execute(f'LOCK TABLE "{schema}".jobs IN ACCESS EXCLUSIVE MODE')
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%%GROUP BY queue%%'"
                ).fetchone()[0]
                >= 1
            ),
            what="the job count to wait for the lock",
        )
        # An idle daemon heartbeats every HEARTBEAT_IDLE: over more than that of the count
        # waiting, its last heartbeat must never grow older, and it must heartbeat.
        ages = []
        watch_until = time.monotonic() + HEARTBEAT_IDLE + 2
        while time.monotonic() < watch_until:
            ages.append(float(conn.execute(age, [daemon.worker_id]).fetchone()[0]))
            time.sleep(0.2)  # sampling a window, not waiting for a condition
        assert max(ages) < HEARTBEAT_IDLE + 3.5, f"the loop stalled: heartbeat ages {ages}"
        assert any(b < a for a, b in itertools.pairwise(ages)), f"no heartbeat: ages {ages}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"pgworkerd_slots" in r.read()  # the endpoint answers meanwhile
        # Stopped while the count still waits: the count's session ends with the daemon.
        daemon.send(signal.SIGTERM)
        assert daemon.wait_exit() == 0
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%GROUP BY queue%%'"
                    " AND pid <> pg_backend_pid()"
                ).fetchone()[0]
                == 0
            ),
            what="the count's session to end",
        )


def queue_labels(text: str) -> set[str]:
    return set(re.findall(r'^pgworkerd_queue_jobs\{[^\n]*?queue="((?:[^"\\]|\\.)*)"', text, re.M))


def metrics_config(daemons: Daemons, port: int, extra: str = "") -> Path:
    config = daemons.config(
        {
            "work": {"target": "jobhandlers:work"},
            "mail": {"target": "jobhandlers:work", "queue": "mail"},
        }
    )
    config.write_text(
        config.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        f'queue_depth_interval = "1s"\n{extra}'
    )
    return config


def test_queue_labels_are_capped_and_stale_ones_removed(
    db: Db, daemons: Daemons, conn: psycopg.Connection, schema: str
) -> None:
    """Audit finding 7: an enqueuer spreads jobs over 5,000 queues. The gauge shows the
    served queues, the top_queues biggest others and "other", and forgets the queues once
    their jobs are deleted."""
    port = free_port()
    daemons.start(metrics_config(daemons, port, "top_queues = 3\n"))
    # Jobs of a handler nobody serves stay pending; q0..q2 hold more jobs than the rest.
    specs = [client.JobSpec("nobody", queue=f"q{i}") for i in range(5000)]
    specs += [client.JobSpec("nobody", queue=f"q{i}") for i in range(3) for _ in range(5 - i)]
    specs.append(client.JobSpec("nobody", queue="default"))
    client.enqueue_many(conn, specs, schema=schema)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return r.read().decode()

    def counted() -> str | None:
        text = scrape()
        other = sample(text, "pgworkerd_queue_jobs", queue="other", status="pending")
        return text if other else None

    text = wait_for(counted, what="the gauge to count the 5,000 queues")
    assert queue_labels(text) == {"default", "mail", "q0", "q1", "q2", "other"}
    assert sample(text, "pgworkerd_queue_jobs", queue="other", status="pending") == 4997
    assert sample(text, "pgworkerd_queue_jobs", queue="q0", status="pending") == 6
    assert sample(text, "pgworkerd_queue_jobs", queue="default", status="pending") == 1
    assert len(text.encode()) < 20_000, f"scrape of {len(text.encode())} bytes"

    conn.execute(f'DELETE FROM "{schema}".jobs WHERE queue <> %s', ["default"])

    def forgotten() -> str | None:
        text = scrape()
        return text if queue_labels(text) == {"default", "mail", "other"} else None

    text = wait_for(forgotten, what="the deleted queues' series to disappear")
    assert sample(text, "pgworkerd_queue_jobs", queue="other", status="pending") == 0
    assert sample(text, "pgworkerd_queue_jobs", queue="default", status="pending") == 1


def thread_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_half_open_connections_hold_no_threads(db: Db, daemons: Daemons) -> None:
    """Audit finding 12: 50 connections that never finish their request. The daemon's
    thread count stays bounded, a real scrape is still served, and the connections are
    closed by the server after its deadline."""
    port = free_port()
    daemon = daemons.start(metrics_config(daemons, port))
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert b"pgworkerd_slots" in r.read()
    base = thread_count(daemon.pid)
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        wait_for(
            lambda: sum(closed_by_server(s) for s in socks) >= 50 - metrics.MAX_CONNECTIONS,
            what="the connections over the cap to be closed at once",
        )
        # The depth counter's thread comes and goes: one of slack.
        assert thread_count(daemon.pid) <= base + metrics.MAX_CONNECTIONS + 1
        with urllib.request.urlopen(url, timeout=10) as r:
            assert b"pgworkerd_slots" in r.read()
        assert thread_count(daemon.pid) <= base + metrics.MAX_CONNECTIONS + 1
        wait_for(
            lambda: all(closed_by_server(s) for s in socks),
            timeout=metrics.CONNECTION_DEADLINE + 30,
            what="the held connections to be closed at the deadline",
        )
        wait_for(lambda: thread_count(daemon.pid) <= base + 1, what="the connection threads to end")
    finally:
        for s in socks:
            s.close()


def closed_by_server(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset: closed with our request unread
        return True
