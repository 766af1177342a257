"""Serving the dashboard: the binding rules, the pool, and waitress.

waitress: a pure-Python production WSGI server with a fixed thread pool, a connection
limit and bounded request sizes, no C extension and no dependency of its own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from pgworkerd.config import WebConfig, is_loopback

log = logging.getLogger("pgworkerd.web")

# Names a loopback-bound dashboard answers to (the Host header without its port).
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


class BindRefused(ValueError):
    """A bind address the configuration does not allow."""


def check_bind(web: WebConfig) -> None:
    """Refuse what would serve pages without a login, unless the operator said so
    (allow_anonymous / --no-login), and even then on a loopback address only."""
    if not web.users and not is_loopback(web.bind):
        raise BindRefused(
            f"refusing to listen on {web.bind!r} without a login: add [web.users] "
            "(`pgworkerd web hash-password`), or bind 127.0.0.1"
        )
    if not web.users and web.trusted_proxy:
        raise BindRefused("refusing a trusted_proxy without a login: add [web.users]")
    if not web.users and not web.allow_anonymous:
        raise BindRefused(
            "refusing to serve without a login: add [web.users] (`pgworkerd web "
            "hash-password`), or say `--no-login` ([web] allow_anonymous = true) to let "
            "every local account and every process of this host act as the dashboard's "
            "database role"
        )


# The serving loop looks at its stop flag at least this often (a signal that lands on
# another thread does not interrupt the loop's poll; one on the main thread does at once).
STOP_CHECK_SECONDS = 0.5
# At stop: how long the loop, the request threads and the pool may take to finish (each
# bounded, so `pgworkerd web` exits within seconds of SIGINT or SIGTERM, however loaded).
LOOP_EXIT_SECONDS = 5.0
REQUESTS_EXIT_SECONDS = 5.0
POOL_CLOSE_SECONDS = 5.0


@dataclass
class Dashboard:
    """A bound server and its pool; `run()` serves until `request_stop()`, `close()` frees
    both.

    Stopping never raises into the serving loop: `request_stop()` only sets a flag that
    `run()` reads between two polls, so it is safe in a signal handler, and the stop is
    done once, by `close()`, each step bounded. (Before, the stop was Python's
    KeyboardInterrupt: none came when SIGINT was inherited as ignored, it landed wherever
    the main thread was, and waitress's own handler of it shut the request threads down
    before `close()` did so again.)"""

    server: Any  # waitress's server (its types are not published)
    pool: Any
    socket_map: dict[int, Any]  # waitress's sockets: the listener, its trigger, the channels
    stop_requested: bool = False
    _loop_done: threading.Event = field(default_factory=threading.Event)
    _loop_started: bool = False

    @property
    def url(self) -> str:
        host = self.server.effective_host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.server.effective_port}/"

    def request_stop(self, *_signal: object) -> None:
        """Ask `run()` to return (takes no lock and raises nothing: signal-handler safe)."""
        self.stop_requested = True

    def run(self) -> None:
        from waitress import wasyncore

        self._loop_started = True
        try:
            while not self.stop_requested and self.socket_map:
                wasyncore.loop(
                    timeout=STOP_CHECK_SECONDS,
                    map=self.socket_map,
                    use_poll=self.server.adj.asyncore_use_poll,
                    count=1,
                )
        finally:
            self._loop_done.set()

    def close(self) -> None:
        from waitress import wasyncore

        self.request_stop()
        if self._loop_started:  # run() in another thread: let it leave the loop first
            self._loop_done.wait(LOOP_EXIT_SECONDS)
        # requests in flight first (they use the trigger and the pool), then the sockets
        self.server.task_dispatcher.shutdown(timeout=REQUESTS_EXIT_SECONDS)
        wasyncore.close_all(self.socket_map)
        self.pool.close(timeout=POOL_CLOSE_SECONDS)


class WritableRole(BindRefused):
    """`read_only` with a database role that could change something (N9): a read-only
    dashboard is one whose role cannot write, not only one that offers no button."""


def check_read_only(pool: Any, schema: str, timeout: float, dsn: str) -> None:
    """Refuse a read-only dashboard whose database role could write (or whose rights
    cannot be read): the role of `read_only = true` is pgworkerd_reader."""
    import psycopg

    from pgworkerd.queue.db import scrub
    from pgworkerd.queue.queries import query

    try:
        with pool.connection(timeout=max(timeout, 10.0)) as conn:
            row = conn.execute(query("role_writes", schema)).fetchone()
    except (psycopg.Error, OSError) as exc:
        reason = scrub(str(exc).strip(), dsn)
        raise WritableRole(
            f"read_only: cannot check that the database role changes nothing: {reason}"
        ) from None
    rights = list(row[0]) if row else []
    if rights:
        shown = ", ".join(rights[:5]) + (f" and {len(rights) - 5} more" if len(rights) > 5 else "")
        raise WritableRole(
            "read_only: refusing a database role that can write ("
            + shown
            + "); connect as pgworkerd_reader (deploy/roles.sql), or leave read_only off"
        )


def build(web: WebConfig, dsn: str, schema: str) -> Dashboard:
    """Bind the address and open the pool (raises BindRefused, OSError for the bind)."""
    from waitress.server import create_server

    from pgworkerd.web.app import Settings, create_app
    from pgworkerd.web.db import open_pool

    check_bind(web)
    allowed = LOOPBACK_NAMES | {web.bind.lower()} if is_loopback(web.bind) else None
    settings = Settings(
        schema=schema,
        users=dict(web.users),
        read_only=web.read_only,
        secure_cookie=web.secure_cookie,
        idle_timeout=web.idle_timeout,
        allowed_hosts=None if allowed is None else frozenset(allowed),
        dsn=dsn,
    )
    # the client's address from the proxy's X-Forwarded-For, from the proxy only
    proxy: dict[str, Any] = {}
    if web.trusted_proxy:
        proxy = {
            "trusted_proxy": web.trusted_proxy,
            "trusted_proxy_count": 1,
            "trusted_proxy_headers": {"x-forwarded-for"},
        }
    pool = open_pool(dsn, size=web.pool_size, statement_timeout=web.statement_timeout)
    if web.read_only:
        try:
            check_read_only(pool, schema, web.statement_timeout, dsn)
        except BaseException:
            pool.close()
            raise
    socket_map: dict[int, Any] = {}
    try:
        server = create_server(
            create_app(settings, pool),
            map=socket_map,
            host=web.bind,
            port=web.port,
            # a few more threads than connections: pages wait briefly for one
            threads=web.pool_size + 2,
            connection_limit=100,
            channel_timeout=30,
            max_request_body_size=64 * 1024,
            max_request_header_size=64 * 1024,
            ident="pgworkerd",
            expose_tracebacks=False,
            # kept (and not believed): a dashboard without a login refuses proxied requests
            clear_untrusted_proxy_headers=False,
            **proxy,
        )
    except BaseException:
        pool.close()
        raise
    return Dashboard(server, pool, socket_map)
