"""Network partitions for the fault tests: two network namespaces of our own (unique names
per run) joined by a veth pair on a private /30, PostgreSQL in one, a daemon in the other.

Only addresses inside the namespaces made here are ever used. A partition is a silent
blackhole: iptables DROP in the client namespace when iptables exists, else the server
end of the veth set down (the client sees NO-CARRIER and its packets vanish). `tc netem`
is not needed.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import subprocess
import sys
import time

IP = shutil.which("ip")
IPTABLES = shutil.which("iptables")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)


def _must(*args: str) -> None:
    proc = _run(*args)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {(proc.stdout + proc.stderr).strip()}")


def unavailable() -> str | None:
    """Why partitions cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if IP is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"pgw-probe-{secrets.token_hex(3)}"
    proc = _run(IP, "netns", "add", probe)
    if proc.returncode != 0:
        return f"cannot create a network namespace: {proc.stderr.strip()}"
    _run(IP, "netns", "del", probe)
    return None


class Partition:
    """`server_ns` (server_ip) <-veth-> `client_ns` (client_ip); cut() and heal()."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.server_ns, self.client_ns = f"pgw-{tag}-s", f"pgw-{tag}-c"
        self.server_if, self.client_if = f"pgw{tag}s", f"pgw{tag}c"  # <= 15 characters
        net = f"10.231.{random.randrange(256)}"
        host = random.randrange(0, 256, 4)
        self.server_ip, self.client_ip = f"{net}.{host + 1}", f"{net}.{host + 2}"
        self.method = "iptables DROP" if IPTABLES else "veth link down"
        self.is_cut = False

    def prefix(self, ns: str) -> tuple[str, ...]:
        assert IP is not None
        return (IP, "netns", "exec", ns)

    def up(self) -> None:
        assert IP is not None
        _must(IP, "netns", "add", self.server_ns)
        _must(IP, "netns", "add", self.client_ns)
        _must(IP, "link", "add", self.server_if, "type", "veth", "peer", "name", self.client_if)
        _must(IP, "link", "set", self.server_if, "netns", self.server_ns)
        _must(IP, "link", "set", self.client_if, "netns", self.client_ns)
        for ns, dev, addr in (
            (self.server_ns, self.server_if, self.server_ip),
            (self.client_ns, self.client_if, self.client_ip),
        ):
            _must(IP, "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _must(IP, "-n", ns, "link", "set", "lo", "up")
            _must(IP, "-n", ns, "link", "set", dev, "up")

    def down(self) -> None:
        """Delete both namespaces (the veth pair goes with them)."""
        assert IP is not None
        for ns in (self.client_ns, self.server_ns):
            _run(IP, "netns", "del", ns)

    def cut(self) -> None:
        """Silently drop everything between the two namespaces."""
        assert IP is not None
        if IPTABLES:
            c = (*self.prefix(self.client_ns), IPTABLES)
            _must(*c, "-I", "OUTPUT", "-d", self.server_ip, "-j", "DROP")
            _must(*c, "-I", "INPUT", "-s", self.server_ip, "-j", "DROP")
        else:
            _must(IP, "-n", self.server_ns, "link", "set", self.server_if, "down")
        self.is_cut = True

    def heal(self, port: int) -> None:
        """Undo cut() and wait until the client namespace reaches server_ip:port."""
        assert IP is not None
        if IPTABLES:
            c = (*self.prefix(self.client_ns), IPTABLES)
            _run(*c, "-D", "OUTPUT", "-d", self.server_ip, "-j", "DROP")
            _run(*c, "-D", "INPUT", "-s", self.server_ip, "-j", "DROP")
        else:
            _must(IP, "-n", self.server_ns, "link", "set", self.server_if, "up")
        self.is_cut = False
        probe = (
            "import socket, sys; "
            f"socket.create_connection(({self.server_ip!r}, {port}), timeout=1).close()"
        )
        deadline = time.monotonic() + 20
        while _run(*self.prefix(self.client_ns), sys.executable, "-c", probe).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.client_ns} cannot reach {self.server_ip}:{port}")
            time.sleep(0.1)
