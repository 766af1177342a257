"""The HTTP server of the metrics endpoint: prometheus-client's own (wsgiref, a thread
per connection, as its start_http_server runs it) with the bounds it lacks. The endpoint
is unauthenticated, so any local user or network peer may connect; unbounded, 300
half-open connections held 300 daemon threads (security audit, finding 12)."""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

log = logging.getLogger("pgworkerd")

# The endpoint's bounds. A scrape is one small request answered with a few kB (the labels
# are capped) in milliseconds; a connection that takes longer is stuck or hostile, and
# must not hold a daemon thread (audit: 300 half-open connections held 300 threads).
MAX_CONNECTIONS = 8  # connections served at once (one thread each)
IO_TIMEOUT = 5.0  # each read or write on a connection
CONNECTION_DEADLINE = 10.0  # a whole connection, however slowly it trickles (seconds)


@dataclass
class _Connection:
    deadline: float  # monotonic time at which the server closes it, done or not
    reading: bool = True  # still sending its request: the first to give way to a new one
    evicted: bool = False  # shut down by the server; its thread is on its way out


class _Discard(io.TextIOBase):
    """wsgi.errors: a client that times out or goes away mid-response is not an error of
    the daemon's, and must not print a traceback into its log."""

    def write(self, text: str) -> int:
        return len(text)


class _Handler(WSGIRequestHandler):
    """One request per connection (wsgiref never keeps a connection alive)."""

    server: BoundedServer

    def setup(self) -> None:
        # StreamRequestHandler applies it per socket (a class attribute by default)
        self.timeout = self.server.io_timeout  # type: ignore[misc]
        super().setup()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:  # the request is in: from now on it is answered, not evicted
            self.server.request_read(self.request)
        return ok

    def get_stderr(self) -> Any:
        return _Discard()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log, as prometheus-client's own handler


class BoundedServer(ThreadingMixIn, WSGIServer):
    """What prometheus-client's start_http_server runs (a thread per connection, through
    wsgiref), with bounds, since any local user or network peer may connect:

    - at most `max_connections` connections at once. When full, a new connection takes
      the place of the oldest one still sending its request (it is shut down, and its
      thread ends at once), so half-open connections cannot keep a real scrape out; when
      every connection is being answered, the new one is closed at once.
    - each read and write times out after `io_timeout`, and every connection is shut
      down at `deadline` seconds however slowly it trickles (checked by the serving
      thread between accepts, every half second).
    """

    daemon_threads = True  # a stuck connection never holds up the daemon's exit
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        *,
        max_connections: int,
        io_timeout: float,
        deadline: float,
    ) -> None:
        self.address_family = family  # read by TCPServer.__init__ to create the socket
        self.max_connections, self.io_timeout, self.deadline = (
            max_connections,
            io_timeout,
            deadline,
        )
        self._slots = threading.Condition()
        self._open: dict[socket.socket, _Connection] = {}  # oldest first
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._admit(request):
            self.shutdown_request(request)  # closed at once: it costs no thread
            return
        try:
            super().process_request(request, client_address)  # starts its thread
        except BaseException:
            self._release(request)
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _admit(self, request: socket.socket) -> bool:
        """Take a slot for `request`, evicting the oldest connection still reading its
        request if need be; waits (at most a second) for an evicted thread to end, so
        the number of threads never exceeds max_connections."""
        give_up = time.monotonic() + 1.0
        with self._slots:
            while len(self._open) >= self.max_connections:
                victim = next(
                    (s for s, c in self._open.items() if c.reading and not c.evicted), None
                )
                if victim is not None:
                    self._evict(victim)
                elif not any(c.evicted for c in self._open.values()):
                    return False  # all busy answering: refuse
                left = give_up - time.monotonic()
                if left <= 0 or not self._slots.wait(left):
                    return False
            self._open[request] = _Connection(time.monotonic() + self.deadline)
            return True

    def _evict(self, sock: socket.socket) -> None:
        """Shut a connection down: its thread's blocked read returns EOF (a write
        fails) and the thread ends. Called with the lock held."""
        self._open[sock].evicted = True
        with contextlib.suppress(OSError):  # already closed by its thread
            sock.shutdown(socket.SHUT_RDWR)

    def _release(self, request: socket.socket) -> None:
        with self._slots:
            self._open.pop(request, None)
            self._slots.notify_all()

    def request_read(self, request: socket.socket) -> None:
        with self._slots:
            connection = self._open.get(request)
            if connection is not None:
                connection.reading = False

    def service_actions(self) -> None:
        """Run by serve_forever after every accept and poll (0.5 s): enforce deadlines."""
        now = time.monotonic()
        with self._slots:
            for sock, connection in self._open.items():
                if connection.deadline <= now and not connection.evicted:
                    self._evict(sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Timeouts and resets of a client's connection: its business, not a traceback
        # on the daemon's stderr (socketserver's default).
        log.debug("metrics: connection from %s ended with an error", client_address)
