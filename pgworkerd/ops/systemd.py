"""sd_notify for Type=notify units: tiny, never raises, a no-op without NOTIFY_SOCKET."""

from __future__ import annotations

import contextlib
import os

import sdnotify


class Notifier:
    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        watchdog_ours = usec.isdigit() and (not pid or pid == str(os.getpid()))
        # Ping at half the interval systemd waits, as sd_watchdog_enabled(3) advises.
        self.watchdog_interval = int(usec) / 2e6 if watchdog_ours else None
        self._last_status = ""

    def send(self, *lines: str) -> None:
        if self._notifier is not None:
            with contextlib.suppress(Exception):
                self._notifier.notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")
        self._last_status = status

    def status(self, status: str) -> None:
        if status != self._last_status:
            self.send(f"STATUS={status}")
            self._last_status = status

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")
        self._last_status = status

    def reloading(self) -> None:
        self.send("RELOADING=1")

    def extend_timeout(self, seconds: float) -> None:
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")
