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
    action_pool: Any = None  # the operator's connections ([web] action_dsn), or None
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
        if self.action_pool is not None:
            self.action_pool.close(timeout=POOL_CLOSE_SECONDS)


class PagesCanWrite(BindRefused):
    """The pages' DSN is a role that can write, where it must only read (N9)."""


def check_pages_read_only(dsn: str, schema: str, timeout: float) -> None:
    """At start, when the database answers: refuse a pages' role that could write
    (raises PagesCanWrite). A database that does not answer is no refusal: every pool
    connection is checked again before it serves (open_pool's read_only_schema)."""
    import logging

    import psycopg

    from pgworkerd.queue.db import scrub
    from pgworkerd.web.db import WritableRole, check_cannot_write, page_conninfo

    try:
        with psycopg.connect(page_conninfo(dsn, timeout), autocommit=True) as conn:
            check_cannot_write(conn, schema)
    except WritableRole as exc:
        raise PagesCanWrite(str(exc)) from None
    except psycopg.Error as exc:
        logging.getLogger("pgworkerd.web").warning(
            "web: cannot check at start that the pages' database role changes nothing "
            "(each connection is checked before it serves): %s",
            scrub(str(exc).strip(), dsn),
        )


def build(web: WebConfig, dsn: str, schema: str) -> Dashboard:
    """Bind the address and open the pool (raises BindRefused, OSError for the bind)."""
    from waitress.server import create_server

    from pgworkerd.web.app import create_app
    from pgworkerd.web.context import Settings
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
        action_dsn=web.action_dsn,
    )
    # the client's address from the proxy's X-Forwarded-For, from the proxy only
    proxy: dict[str, Any] = {}
    if web.trusted_proxy:
        proxy = {
            "trusted_proxy": web.trusted_proxy,
            "trusted_proxy_count": 1,
            "trusted_proxy_headers": {"x-forwarded-for"},
        }
    # read_only, or actions on a DSN of their own: the pages' role must not write
    pages_read_only = web.read_only or bool(web.action_dsn)
    if pages_read_only:
        check_pages_read_only(dsn, schema, web.statement_timeout)
    pool = open_pool(
        dsn,
        size=web.pool_size,
        statement_timeout=web.statement_timeout,
        read_only_schema=schema if pages_read_only else None,
    )
    action_pool = None
    try:
        if web.action_dsn:
            # one action at a time is plenty (a person clicking); a second for overlap
            action_pool = open_pool(web.action_dsn, size=2, statement_timeout=web.statement_timeout)
    except BaseException:
        pool.close()
        raise
    socket_map: dict[int, Any] = {}
    try:
        server = create_server(
            create_app(settings, pool, action_pool),
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
        if action_pool is not None:
            action_pool.close()
        raise
    return Dashboard(server, pool, socket_map, action_pool=action_pool)
