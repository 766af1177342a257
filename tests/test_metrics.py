"""Unit tests of the Prometheus endpoint (pgworkerd/metrics.py) and its [metrics] config:
a real HTTP server on a free port, scraped with urllib; no database."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pgworkerd import metrics
from pgworkerd.config import ConfigError, MetricsConfig, load_config, parse_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in the exposition text, or None if absent."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m or m[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        if found == labels:
            return float(m[3])
    return None


@pytest.fixture
def live() -> Iterator[metrics.Metrics]:
    m = metrics.create(MetricsConfig(listen=f"127.0.0.1:{free_port()}"))
    assert isinstance(m, metrics.Metrics) and m.enabled
    m.start()
    try:
        yield m
    finally:
        m.stop()


def test_counters_gauges_and_histogram_are_served(live: metrics.Metrics) -> None:
    live.set_worker("web1:123:abcdef", "0.1.0")
    for _ in range(3):
        live.claimed("send_mail")
    live.claimed("send_mail", rescued=True)
    live.claimed("resize")
    live.outcome("send_mail", "complete")
    live.completed("send_mail")
    live.outcome("resize", "fail")
    live.failed("resize")
    live.outcome("resize", "release")
    live.outcome("resize", "cancel")
    live.outcome("send_mail", "complete", ok=False)
    live.fenced("resize", "fail")
    live.lease_renewed(5)
    live.lease_renewed()
    live.lease_lost("resize")
    live.set_in_flight(3, 8)
    live.set_draining(True)
    live.observe_start_latency(0.02)
    live.observe_start_latency(7.0)
    live.observe_start_latency(-1.0)  # clock skew: counted as 0

    text = scrape(live.port)
    p = "pgworkerd_"
    assert sample(text, p + "daemon_info", worker_id="web1:123:abcdef", version="0.1.0") == 1
    assert sample(text, p + "jobs_claimed_total", handler="send_mail") == 4
    assert sample(text, p + "jobs_claimed_total", handler="resize") == 1
    assert sample(text, p + "jobs_rescued_total", handler="send_mail") == 1
    assert sample(text, p + "jobs_rescued_total", handler="resize") is None
    assert sample(text, p + "jobs_completed_total", handler="send_mail") == 2
    assert sample(text, p + "jobs_failed_total", handler="resize") == 2
    assert sample(text, p + "jobs_released_total", handler="resize") == 1
    assert sample(text, p + "jobs_cancelled_total", handler="resize") == 1
    assert sample(text, p + "outcomes_fenced_total", handler="send_mail", outcome="complete") == 1
    assert sample(text, p + "outcomes_fenced_total", handler="resize", outcome="fail") == 1
    assert sample(text, p + "lease_renewals_total") == 6
    assert sample(text, p + "lease_losses_total", handler="resize") == 1
    assert sample(text, p + "jobs_in_flight") == 3
    assert sample(text, p + "slots") == 8
    assert sample(text, p + "draining") == 1
    h = p + "job_start_latency_seconds"
    assert sample(text, h + "_count") == 3
    assert sample(text, h + "_sum") == pytest.approx(7.02)
    assert sample(text, h + "_bucket", le="0.025") == 2
    assert sample(text, h + "_bucket", le="5.0") == 2
    assert sample(text, h + "_bucket", le="10.0") == 3
    assert "# TYPE pgworkerd_job_start_latency_seconds histogram" in text

    live.set_draining(False)
    live.set_in_flight(0)
    text = scrape(live.port)
    assert sample(text, p + "draining") == 0
    assert sample(text, p + "jobs_in_flight") == 0
    assert sample(text, p + "slots") == 8


def test_queue_depth_is_a_full_snapshot_with_zeros(live: metrics.Metrics) -> None:
    assert live.queue_depth_due()
    live.set_queue_depth(
        [("default", "pending", 7), ("default", "running", 2), ("mail", "dead", 1)]
    )
    assert not live.queue_depth_due()  # refreshed: not again before queue_depth_interval
    text = scrape(live.port)
    name = "pgworkerd_queue_jobs"
    assert "# TYPE pgworkerd_queue_jobs gauge" in text
    assert sample(text, name, queue="default", status="pending") == 7
    assert sample(text, name, queue="default", status="running") == 2
    assert sample(text, name, queue="default", status="completed") == 0
    assert sample(text, name, queue="mail", status="dead") == 1
    assert sample(text, name, queue="mail", status="pending") == 0

    # The next snapshot replaces the last; a queue that emptied stays, at zero.
    live.set_queue_depth([("default", "completed", 9)])
    text = scrape(live.port)
    assert sample(text, name, queue="default", status="pending") == 0
    assert sample(text, name, queue="default", status="completed") == 9
    assert sample(text, name, queue="mail", status="dead") == 0


def test_queue_depth_due_follows_the_interval() -> None:
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0", queue_depth_interval=0.05))
    assert m.queue_depth_due()
    m.set_queue_depth([])
    assert not m.queue_depth_due()
    m._depth_at -= 0.1
    assert m.queue_depth_due()


def test_start_latency_from_run_at_or_enqueue(live: metrics.Metrics) -> None:
    now = datetime.now(UTC)
    # Enqueued 3 s ago to run at once: 3 s.
    seconds = metrics.start_latency_seconds(now - timedelta(seconds=3), now - timedelta(seconds=3))
    assert 2.5 < seconds < 10
    # Scheduled: counted from run_at, not from the enqueue an hour ago.
    seconds = metrics.start_latency_seconds(now - timedelta(seconds=1), now - timedelta(hours=1))
    assert 0.5 < seconds < 10
    # run_at in the past before the enqueue (run_at given as a past time): from the enqueue.
    seconds = metrics.start_latency_seconds(now - timedelta(days=1), now - timedelta(seconds=2))
    assert 1.5 < seconds < 10
    # Our clock behind the database's: 0, not negative.
    assert metrics.start_latency_seconds(now + timedelta(seconds=5), now) == 0.0
    live.observe_job_start(now - timedelta(seconds=3), now - timedelta(seconds=3))
    assert sample(scrape(live.port), "pgworkerd_job_start_latency_seconds_count") == 1


def test_methods_never_raise_into_the_daemon(
    live: metrics.Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    live.set_in_flight("many")  # type: ignore[arg-type]
    live.set_queue_depth([("only-two", 1)])  # type: ignore[list-item]
    live.observe_start_latency(None)  # type: ignore[arg-type]
    live.lease_renewed("x")  # type: ignore[arg-type]
    assert len([r for r in caplog.records if "metrics:" in r.getMessage()]) == 1
    live.claimed("ok")  # still working afterwards
    assert sample(scrape(live.port), "pgworkerd_jobs_claimed_total", handler="ok") == 1


def test_a_port_in_use_is_a_clear_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        m = metrics.Metrics(MetricsConfig(listen=f"127.0.0.1:{port}"))
        with pytest.raises(ConfigError) as info:
            m.start()
    assert isinstance(info.value, metrics.MetricsError)
    message = str(info.value)
    assert f"metrics.listen = '127.0.0.1:{port}'" in message
    assert "Address already in use" in message


def test_an_unknown_host_is_a_clear_config_error() -> None:
    m = metrics.Metrics(MetricsConfig(listen="no-such-host.invalid:9464"))
    with pytest.raises(metrics.MetricsError, match="cannot serve the Prometheus endpoint"):
        m.start()


def test_port_zero_serves_on_a_free_port() -> None:
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0"))
    m.start()
    try:
        assert m.port and m.port > 0
        assert m.address == f"127.0.0.1:{m.port}"
        assert "pgworkerd_jobs_in_flight" in scrape(m.port)
    finally:
        m.stop()
    with pytest.raises(OSError):
        scrape(m.port)


def test_private_registry_two_instances_do_not_collide() -> None:
    a = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0"))
    b = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0"))
    a.claimed("h")
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("pgworkerd_jobs_claimed_total", {"handler": "h"}) is None
    assert a.registry.get_sample_value("pgworkerd_jobs_claimed_total", {"handler": "h"}) == 1
    assert b.registry.get_sample_value("pgworkerd_jobs_claimed_total", {"handler": "h"}) is None


def test_disabled_metrics_do_nothing_and_open_no_port() -> None:
    port = free_port()
    m = metrics.create(MetricsConfig())
    assert not m.enabled and not isinstance(m, metrics.Metrics)
    m.start()
    m.set_worker("w", "v")
    m.claimed("h", rescued=True)
    m.outcome("h", "complete")
    m.completed("h")
    m.failed("h")
    m.fenced("h", "fail")
    m.lease_renewed(3)
    m.lease_lost("h")
    m.set_in_flight(1, 2)
    m.set_draining(True)
    assert m.queue_depth_due() is False  # the daemon never counts jobs for nothing
    m.set_queue_depth([("q", "pending", 1)])
    m.observe_start_latency(1.0)
    m.observe_job_start(datetime.now(UTC), datetime.now(UTC))
    m.stop()
    assert m.port is None
    # Nothing listens on a port we know to be free, and no server thread was started.
    import threading

    assert not [t for t in threading.enumerate() if "serve_forever" in repr(t)]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_disabled_metrics_need_no_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    assert isinstance(metrics.create(MetricsConfig()), metrics.NullMetrics)
    with pytest.raises(metrics.MetricsError, match=r"pip install 'pgworkerd\[metrics\]'"):
        metrics.create(MetricsConfig(listen="127.0.0.1:9464"))


# -- the [metrics] table -------------------------------------------------------------------


def test_metrics_config_defaults_and_values() -> None:
    config = parse_config("", "x.toml")
    assert config.metrics == MetricsConfig(listen="", queue_depth_interval=15.0)
    assert not config.metrics.enabled
    config = parse_config(
        '[metrics]\nlisten = "[::1]:9464"\nqueue_depth_interval = "5s"\n', "x.toml"
    )
    assert config.metrics.enabled
    assert config.metrics.address == ("::1", 9464)
    assert config.metrics.queue_depth_interval == 5.0
    assert parse_config('[metrics]\nlisten = ":9464"\n', "x").metrics.address == ("", 9464)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('\n[metrics]\nlisten = "9464"\n', 'x.toml:3: metrics.listen: expected "HOST:PORT"'),
        ('[metrics]\nlisten = "h:70000"\n', 'x.toml:2: metrics.listen: expected "HOST:PORT"'),
        ('[metrics]\nlisten = "::1:9464"\n', "x.toml:2: metrics.listen: '::1:9464': bad host"),
        ("[metrics]\nlisten = 9464\n", "x.toml:2: metrics.listen: expected a string"),
        ('[metrics]\nqueue_depth_interval = "0s"\n', "metrics.queue_depth_interval: must be"),
        ("[metrics]\nport = 9464\n", "x.toml:2: metrics.port: unknown key (known keys here: "),
    ],
)
def test_metrics_config_errors_name_key_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "x.toml")
    assert str(info.value).startswith(expected) or expected in str(info.value), info.value


def test_metrics_config_needs_prometheus_client_when_enabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "prometheus_client" else real(name, *a),
    )
    parse_config("[metrics]\n", "x.toml")  # disabled: fine without it
    with pytest.raises(ConfigError, match=r"x.toml:2: metrics.listen: .*prometheus-client"):
        parse_config('[metrics]\nlisten = "127.0.0.1:9464"\n', "x.toml")


def test_example_config_documents_the_metrics_table() -> None:
    config = load_config(Path(__file__).resolve().parent.parent / "config.example.toml")
    assert config.metrics == MetricsConfig()
