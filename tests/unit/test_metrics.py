"""Unit tests of the Prometheus endpoint (pgworkerd/metrics.py) and its [metrics] config:
a real HTTP server on a free port, scraped with urllib; no database."""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pgworkerd.config import ConfigError, MetricsConfig, load_config, parse_config
from pgworkerd.ops import metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int | None) -> str:
    assert port is not None, "the metrics server is not listening"
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


def queue_labels(text: str) -> set[str]:
    """The queue label values of the pgworkerd_queue_jobs series, as exposed (escaped)."""
    return set(re.findall(r'^pgworkerd_queue_jobs\{[^\n]*?queue="((?:[^"\\]|\\.)*)"', text, re.M))


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
    live.outcome("send_mail", "complete")
    live.outcome("resize", "fail")
    live.outcome("resize", "fail")
    live.outcome("resize", "release")
    live.outcome("resize", "cancel")
    live.outcome("send_mail", "complete", ok=False)
    live.outcome("resize", "fail", ok=False)
    live.lease_renewed(5)
    live.lease_renewed()
    live.lease_lost("resize")
    live.set_in_flight(3, 8)
    live.set_draining(True)
    now = datetime.now(UTC)
    live.observe_job_start(now - timedelta(seconds=7), now - timedelta(seconds=7))
    # Due in the future by our clock (the database's runs ahead): counted as 0, twice.
    live.observe_job_start(now + timedelta(hours=1), now)
    live.observe_job_start(now, now + timedelta(hours=1))

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
    assert 7.0 <= sample(text, h + "_sum") < 10  # type: ignore[operator]
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

    # The next snapshot replaces the last; a queue no longer in it is no longer exported
    # (this daemon serves no queue here, so none is kept at zero).
    live.set_queue_depth([("default", "completed", 9)])
    text = scrape(live.port)
    assert sample(text, name, queue="default", status="pending") == 0
    assert sample(text, name, queue="default", status="completed") == 9
    assert sample(text, name, queue="mail", status="dead") is None
    assert "mail" not in queue_labels(text)


def test_queue_depth_due_follows_the_interval() -> None:
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0", queue_depth_interval=0.05))
    assert m.queue_depth_due()
    m.set_queue_depth([])
    assert not m.queue_depth_due()
    m._depth_at -= 0.1
    assert m.queue_depth_due()


# -- bounded labels (audit findings 7 and 12) ----------------------------------------------


def test_queue_series_are_capped_to_served_plus_top_plus_other() -> None:
    """5,000 queues in the snapshot: the served queues, the 3 biggest others and "other"
    (the sum of the rest) are exported, nothing more, and the scrape stays small."""
    m = metrics.create(
        MetricsConfig(listen="127.0.0.1:0", top_queues=3), queues=("default", "mail")
    )
    m.start()
    try:
        rows = [(f"q{i}", "pending", 1) for i in range(5000) if i not in (7, 9)]
        rows += [("q7", "pending", 51), ("q9", "pending", 1), ("q9", "dead", 30)]
        rows += [("big", "pending", 100), ("default", "pending", 2)]
        m.set_queue_depth(rows)
        text = scrape(m.port)
        assert queue_labels(text) == {"default", "mail", "big", "q7", "q9", "other"}
        name = "pgworkerd_queue_jobs"
        assert sample(text, name, queue="big", status="pending") == 100
        assert sample(text, name, queue="q9", status="dead") == 30
        assert sample(text, name, queue="mail", status="pending") == 0  # served: kept at 0
        assert sample(text, name, queue="other", status="pending") == 4998
        assert len(text.encode()) < 20_000, len(text.encode())

        # Stale series go: the next snapshot without q7 and big drops their label sets;
        # served queues and "other" stay (at zero).
        m.set_queue_depth([("q9", "pending", 4), ("zz", "failed", 1)])
        text = scrape(m.port)
        assert queue_labels(text) == {"default", "mail", "q9", "zz", "other"}
        assert sample(text, name, queue="q7", status="pending") is None
        assert sample(text, name, queue="other", status="pending") == 0
        m.set_queue_depth([])
        assert queue_labels(scrape(m.port)) == {"default", "mail", "other"}
    finally:
        m.stop()


def test_rows_already_capped_by_the_statement_are_summed_under_other() -> None:
    """The daemon's count returns the rest of the queues as queue NULL: that is "other";
    a real queue called "other" is counted with them."""
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0", top_queues=1), queues=("default",))
    m.set_queue_depth([(None, "pending", 40), ("other", "pending", 2), ("default", "dead", 1)])
    assert (
        m.registry.get_sample_value("pgworkerd_queue_jobs", {"queue": "other", "status": "pending"})
        == 42
    )


def test_label_values_are_printable() -> None:
    """Prometheus's text format escapes only backslash, quote and newline: ESC and the
    other control characters an enqueuer puts in a queue name must not reach a terminal
    or a dashboard raw. Names that end up with the same label are summed, not repeated."""
    assert metrics.label_value("default") == "default"
    assert metrics.label_value("a\x1bb\x07\u202e\x00\x9b") == "a\\x1bb\\x07\\u202e\\x00\\x9b"
    assert metrics.label_value("é 日本 ok") == "é 日本 ok"
    assert len(metrics.label_value("q" * 10_000)) <= metrics.LABEL_MAX
    m = metrics.create(MetricsConfig(listen="127.0.0.1:0"))
    m.start()
    try:
        m.set_worker("web1:1:abc\x1b[2J", "0.1")
        m.claimed("evil\x1b]0;PWNED\x07")
        m.set_queue_depth(
            [("default\x1b[31mRED", "pending", 1), ("default\\x1b[31mRED", "pending", 2)]
        )
        raw = urllib.request.urlopen(f"http://127.0.0.1:{m.port}/metrics", timeout=10).read()
        assert not [b for b in raw if b < 0x20 and b != 0x0A], "control bytes in the scrape"
        text = raw.decode()
        # The backslash of the escape is itself escaped by the text format.
        queue, handler = "default\\\\x1b[31mRED", "evil\\\\x1b]0;PWNED\\\\x07"
        assert sample(text, "pgworkerd_queue_jobs", queue=queue, status="pending") == 3
        assert sample(text, "pgworkerd_jobs_claimed_total", handler=handler) == 1
    finally:
        m.stop()


def test_handler_labels_only_for_configured_handlers() -> None:
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0"), handlers=("send_mail",))
    m.claimed("send_mail")
    m.claimed("from_a_row", rescued=True)
    m.outcome("from_a_row", "complete")
    m.outcome("another", "fail", ok=False)
    m.lease_lost("yet_another")
    value = m.registry.get_sample_value
    assert value("pgworkerd_jobs_claimed_total", {"handler": "send_mail"}) == 1
    assert value("pgworkerd_jobs_claimed_total", {"handler": "other"}) == 1
    assert value("pgworkerd_jobs_rescued_total", {"handler": "other"}) == 1
    assert value("pgworkerd_jobs_completed_total", {"handler": "other"}) == 1
    assert value("pgworkerd_outcomes_fenced_total", {"handler": "other", "outcome": "fail"}) == 1
    assert value("pgworkerd_lease_losses_total", {"handler": "other"}) == 1
    assert value("pgworkerd_jobs_claimed_total", {"handler": "from_a_row"}) is None


# -- the endpoint's bounds -----------------------------------------------------------------


def half_open(port: int | None, count: int) -> list[socket.socket]:
    """Connections that start a request and never finish it (no blank line)."""
    assert port is not None, "the metrics server is not listening"
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed this connection (EOF or reset), without blocking."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset: the server closed it with our request unread
        return True


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_half_open_connections_are_capped_evicted_and_timed_out() -> None:
    """50 half-open connections hold at most max_connections threads; a real scrape is
    served meanwhile (it takes the slot of the oldest connection still sending its
    request); the ones left are closed at the connection deadline."""
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0"))
    m.max_connections, m.io_timeout, m.connection_deadline = 4, 2.0, 3.0
    m.start()
    socks: list[socket.socket] = []
    try:
        base = threading.active_count()
        socks = half_open(m.port, 50)
        wait_until(
            lambda: sum(closed_by_server(s) for s in socks) >= 50 - 4,
            10,
            "the excess connections to be closed at once",
        )
        assert threading.active_count() <= base + 4
        started = time.monotonic()
        assert "pgworkerd_slots" in scrape(m.port)  # served during the flood
        assert time.monotonic() - started < 2.0
        assert threading.active_count() <= base + 4
        wait_until(
            lambda: all(closed_by_server(s) for s in socks),
            3.0 + 15,
            "the held connections to be closed at the deadline",
        )
        wait_until(lambda: threading.active_count() <= base, 10, "their threads to end")
        assert "pgworkerd_slots" in scrape(m.port)
    finally:
        for s in socks:
            s.close()
        m.stop()


def test_a_trickling_client_is_cut_at_the_connection_deadline() -> None:
    """A byte per half second never trips the read timeout; the deadline still ends it."""
    m = metrics.Metrics(MetricsConfig(listen="127.0.0.1:0"))
    m.io_timeout, m.connection_deadline = 2.0, 2.0
    m.start()
    try:
        s = socket.create_connection(("127.0.0.1", m.port), timeout=10)
        started = time.monotonic()
        with s:
            try:
                for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 30:
                    s.send(bytes([byte]))
                    time.sleep(0.5)  # the trickle itself, not a wait for a condition
                    if closed_by_server(s):
                        break
                    s.setblocking(True)
            except OSError:
                pass  # reset while sending: closed by the server
        assert time.monotonic() - started < 2.0 + 8, "not cut at the deadline"
        assert time.monotonic() - started > 1.5
    finally:
        m.stop()


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
    live.observe_job_start(None, None)  # type: ignore[arg-type]
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
    m.outcome("h", "fail")
    m.outcome("h", "fail", ok=False)
    m.lease_renewed(3)
    m.lease_lost("h")
    m.set_in_flight(1, 2)
    m.set_draining(True)
    assert m.queue_depth_due() is False  # the daemon never counts jobs for nothing
    m.set_queue_depth([("q", "pending", 1)])
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
    assert config.metrics.top_queues == 20
    assert parse_config("[metrics]\ntop_queues = 0\n", "x").metrics.top_queues == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('\n[metrics]\nlisten = "9464"\n', 'x.toml:3: metrics.listen: expected "HOST:PORT"'),
        ('[metrics]\nlisten = "h:70000"\n', 'x.toml:2: metrics.listen: expected "HOST:PORT"'),
        ('[metrics]\nlisten = "::1:9464"\n', "x.toml:2: metrics.listen: '::1:9464': bad host"),
        ("[metrics]\nlisten = 9464\n", "x.toml:2: metrics.listen: expected a string"),
        ('[metrics]\nqueue_depth_interval = "0s"\n', "metrics.queue_depth_interval: must be"),
        ("[metrics]\ntop_queues = -1\n", "x.toml:2: metrics.top_queues: expected an integer >= 0"),
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
    config = load_config(Path(__file__).resolve().parents[2] / "config.example.toml")
    assert config.metrics == MetricsConfig()


def test_attempt_histograms_per_handler(live: metrics.Metrics) -> None:
    live.observe_attempt("resize", 2.0, 1.5, 300 << 20)
    live.observe_attempt("resize", 0.5, None, None)  # not measured: duration only
    text = scrape(live.port)
    assert sample(text, "pgworkerd_attempt_duration_seconds_count", handler="resize") == 2
    assert sample(text, "pgworkerd_attempt_duration_seconds_sum", handler="resize") == 2.5
    assert sample(text, "pgworkerd_attempt_cpu_seconds_count", handler="resize") == 1
    assert sample(text, "pgworkerd_attempt_cpu_seconds_sum", handler="resize") == 1.5
    assert sample(text, "pgworkerd_attempt_peak_memory_bytes_sum", handler="resize") == 300 << 20
    le = "5.36870912e+08"  # 512 MiB, as prometheus-client writes it
    assert sample(text, "pgworkerd_attempt_peak_memory_bytes_bucket", handler="resize", le=le) == 1


def test_silent_daemon_gauges_have_no_labels_and_start_at_zero(live: metrics.Metrics) -> None:
    """Fleet-wide counts (views.silent_jobs): one series each, whatever daemons come and
    go (their ids change at every start: no label may carry them)."""
    text = scrape(live.port)
    assert sample(text, "pgworkerd_silent_daemon_jobs") == 0
    assert sample(text, "pgworkerd_silent_daemons") == 0
    live.set_silent(7, 2)
    text = scrape(live.port)
    assert sample(text, "pgworkerd_silent_daemon_jobs") == 7
    assert sample(text, "pgworkerd_silent_daemons") == 2
    assert not re.search(r"^pgworkerd_silent_\w+\{", text, re.M)
    metrics.NullMetrics().set_silent(1, 1)  # disabled: nothing, no error


def test_wait_time_per_handler_behind_the_charts_is_bounded_by_the_configured_handlers() -> None:
    """job_wait_seconds{handler}: the Charts page's wait time in Prometheus, labelled by
    the configured handlers only (any other name a row holds is "other")."""
    m = metrics.Metrics(MetricsConfig(listen=f"127.0.0.1:{free_port()}"), handlers=["mail"])
    m.start()
    try:
        now = datetime.now(UTC)
        m.observe_job_start(now - timedelta(seconds=3), now - timedelta(seconds=3), "mail")
        for n in range(50):
            m.observe_job_start(now, now, f"forged-{n}")
        m.observe_job_start(now, now)  # no handler: the fleet-wide histogram only
        text = scrape(m.port)
    finally:
        m.stop()
    h = "pgworkerd_job_wait_seconds"
    assert sample(text, h + "_count", handler="mail") == 1
    assert sample(text, h + "_bucket", handler="mail", le="2.5") == 0
    assert sample(text, h + "_bucket", handler="mail", le="5.0") == 1
    assert sample(text, h + "_count", handler="other") == 50
    assert {
        line.split('handler="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith(h + "_count")
    } == {"mail", "other"}
    assert sample(text, "pgworkerd_job_start_latency_seconds_count") == 52
