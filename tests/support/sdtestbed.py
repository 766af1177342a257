"""A real, hermetic systemd for integration tests: systemd as PID 1 of fresh PID, mount,
cgroup, UTS and IPC namespaces, running nothing but journald and the units a test installs.

    reason = unavailable_reason()          # None, or why this machine cannot do it
    with Testbed(state_dir) as tb:         # boots in well under a second
        tb.install_unit("x.service", text) # into /run/systemd/system, then daemon-reload
        tb.systemctl("start", "x.service")
        tb.show("x.service", "ActiveState")

Hermetic means it never touches the host's services, units, journal or cgroup v1
hierarchies: its unit search path holds only a few stock targets plus journald (copied
without their `.wants`), generators are disabled, /run is a private tmpfs, the journal is
volatile, and PID 1's console and /dev/kmsg are a log file. It does share the host's file
systems (except /run) and network, so a test's files under /tmp and a PostgreSQL on
127.0.0.1 are reachable from its units.

Needs root, util-linux's `unshare` and `nsenter`, systemd (tested with 252) and a cgroup v2
hierarchy (pure v2, or the `unified` one of a hybrid host). The namespace dies with the
process that booted it, even when that process is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

_SYSTEMD_CANDIDATES = ("/usr/lib/systemd/systemd", "/lib/systemd/systemd")
_UNIT_DIR_CANDIDATES = ("/usr/lib/systemd/system", "/lib/systemd/system")
_CGROUP_PREFIX = "pgworkerd-sdtb-"
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)

# Stock units the testbed boots with (their .wants are deliberately not copied).
_STOCK_UNITS = (
    "sysinit.target",
    "basic.target",
    "sockets.target",
    "paths.target",
    "timers.target",
    "slices.target",
    "local-fs.target",
    "local-fs-pre.target",
    "network.target",
    "network-pre.target",
    "network-online.target",
    "nss-lookup.target",
    "multi-user.target",
    "shutdown.target",
    "umount.target",
    "final.target",
    "poweroff.target",
    "systemd-poweroff.service",
    "exit.target",
    "systemd-exit.service",
    "halt.target",
    "systemd-halt.service",
    "reboot.target",
    "systemd-reboot.service",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
)
_REQUIRED_UNITS = ("systemd-journald.service", "systemd-journald.socket", "exit.target")

# Runs inside the new namespaces as the process that becomes PID 1 (it execs systemd).
# Arguments: console log, stock unit dir, systemd binary, units to copy.
_INIT_SCRIPT = r"""#!/bin/bash
set -euo pipefail
CONSOLE=$1; STOCK=$2; SYSTEMD=$3; shift 3
# /run: a private tmpfs (hides the host's /run, its sockets and its systemd state)
mount -t tmpfs -o mode=0755,size=64m tmpfs /run
# a pure cgroup v2 view rooted at our own cgroup (the cgroup namespace's root): systemd runs
# in unified mode and never touches the host's v1 hierarchies
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup 2>/dev/null \
  || mount -t cgroup2 cgroup2 /sys/fs/cgroup
B=/run/testbed/base
mkdir -p /run/systemd/system /run/systemd/journald.conf.d $B /run/testbed/empty
# journald: memory only, never the host's /var/log/journal nor its kernel log
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\nReadKMsg=no\nForwardToConsole=no\n' \
  > /run/systemd/journald.conf.d/testbed.conf
for u in "$@"; do
  [ -e "$STOCK/$u" ] && cp "$STOCK/$u" "$B/"
done
cat > $B/testbed.target <<'EOF'
[Unit]
Description=Minimal testbed target (journald only)
Wants=systemd-journald.socket systemd-journald-dev-log.socket systemd-journald.service
After=systemd-journald.service
AllowIsolate=yes
EOF
# PID 1 writes to /dev/console and journald/shutdown to /dev/kmsg: both become the log file
# (private mount namespace: the host's devices are untouched)
mount --bind "$CONSOLE" /dev/console
mount --bind "$CONSOLE" /dev/kmsg
# container= makes systemd behave as in a container (poweroff = exit, no swap/loop/DM work)
exec env -i container=pgworkerd-testbed \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  SYSTEMD_UNIT_PATH=/run/systemd/system:$B \
  SYSTEMD_GENERATOR_PATH=/run/testbed/empty \
  SYSTEMD_ENVIRONMENT_GENERATOR_PATH=/run/testbed/empty \
  "$SYSTEMD" --system --unit=testbed.target --show-status=false --log-target=journal
"""


class TestbedError(RuntimeError):
    """The testbed failed to boot or a command inside it failed."""

    __test__ = False  # not a pytest test class, despite the name


def _first_existing(paths: tuple[str, ...], what: str = "") -> str | None:
    for p in paths:
        if Path(p, what).exists():
            return p
    return None


def _cgroup2_root() -> Path | None:
    """The host's cgroup v2 mount: /sys/fs/cgroup on a pure v2 host, else the hybrid
    layout's /sys/fs/cgroup/unified."""
    mounts: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3:
                mounts[fields[1]] = fields[2]
    for path in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if mounts.get(path) == "cgroup2":
            return Path(path)
    return None


def unavailable_reason() -> str | None:
    """Why this machine cannot boot the testbed (a pytest skip reason), or None."""
    if not Path("/proc/self/ns/pid").exists():
        return "systemd testbed: needs Linux namespaces"
    if os.geteuid() != 0:
        return "systemd testbed: needs root (namespaces, cgroups, mounts)"
    for tool in ("unshare", "nsenter", "systemctl", "journalctl"):
        if shutil.which(tool) is None:
            return f"systemd testbed: `{tool}` not found (install util-linux / systemd)"
    if _first_existing(_SYSTEMD_CANDIDATES) is None:
        return "systemd testbed: no systemd binary (install Debian's `systemd` package)"
    unit_dir = _first_existing(_UNIT_DIR_CANDIDATES, "systemd-journald.service")
    if unit_dir is None:
        return "systemd testbed: systemd's stock units (systemd-journald.service) not found"
    root = _cgroup2_root()
    if root is None:
        return "systemd testbed: no cgroup v2 hierarchy mounted (needs pure v2 or hybrid)"
    if not os.access(root, os.W_OK):
        return f"systemd testbed: cannot create cgroups under {root} (read-only)"
    # The namespaces and the cgroup2 mount it needs, tried out in a throwaway namespace.
    probe = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--propagation",
            "private",
            "--uts",
            "--ipc",
            "--cgroup",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /mnt && mkdir /mnt/cg && mount -t cgroup2 cgroup2 /mnt/cg",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if probe.returncode != 0:
        detail = (probe.stderr or probe.stdout).strip().splitlines()
        return (
            "systemd testbed: cannot create namespaces or mount cgroup2 in one "
            f"({detail[-1] if detail else f'exit {probe.returncode}'})"
        )
    return None


def _reap_stale_cgroups(root: Path) -> None:
    """Remove cgroups left by testbeds whose owner was killed (their namespace died with it,
    so they are empty; rmdir fails on a live one). Not young ones: an empty young one may
    belong to a testbed booting right now, before its launcher moved in."""
    for cg in root.glob(_CGROUP_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if time.time() - cg.stat().st_mtime > 60:
                _rmdir_tree(cg)


def _rmdir_tree(path: Path) -> None:
    """rmdir a cgroup tree depth first (cgroup dirs hold only pseudo-files)."""
    for sub, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(sub)


class Testbed:
    """One booted systemd. `pid` is its PID as the host sees it (PID 1 inside)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, state_dir: Path, name: str | None = None) -> None:
        self.name = name or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.state_dir = Path(state_dir)
        self.console_log = self.state_dir / "console.log"
        self.pid: int | None = None
        self._unshare: subprocess.Popen[bytes] | None = None
        root = _cgroup2_root()
        if root is None:
            raise TestbedError("no cgroup v2 hierarchy (check unavailable_reason() first)")
        self.cgroup = root / f"{_CGROUP_PREFIX}{self.name}"
        self._cgroup_root = root

    # -- lifetime ---------------------------------------------------------------------

    def boot(self, timeout: float = 30.0) -> None:
        systemd = _first_existing(_SYSTEMD_CANDIDATES)
        stock = _first_existing(_UNIT_DIR_CANDIDATES, "systemd-journald.service")
        if systemd is None or stock is None:
            raise TestbedError("systemd not installed (check unavailable_reason() first)")
        missing = [u for u in _REQUIRED_UNITS if not Path(stock, u).exists()]
        if missing:
            raise TestbedError(f"stock units missing from {stock}: {', '.join(missing)}")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.console_log.write_text("")
        init = self.state_dir / "init.sh"
        init.write_text(_INIT_SCRIPT)
        init.chmod(0o755)
        _reap_stale_cgroups(self._cgroup_root)
        self.cgroup.mkdir()
        procs = self.cgroup / "cgroup.procs"

        def enter_cgroup() -> None:
            # In the child before exec: our own (controller-less) v2 cgroup becomes the
            # namespace's cgroup root; and if the test process dies, so does unshare, and
            # --kill-child then takes PID 1 and the whole namespace with it.
            procs.write_text(str(os.getpid()))
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

        with self.console_log.open("ab") as console:
            self._unshare = subprocess.Popen(
                [
                    "unshare",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount",
                    "--propagation",
                    "private",
                    "--mount-proc",
                    "--uts",
                    "--ipc",
                    "--cgroup",
                    "/bin/bash",
                    str(init),
                    str(self.console_log),
                    stock,
                    systemd,
                    *_STOCK_UNITS,
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=console,
                env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
                preexec_fn=enter_cgroup,
                start_new_session=True,  # a Ctrl-C for pytest is not a signal for it
            )
        try:
            self._wait_booted(timeout)
        except BaseException:
            self.teardown()
            raise

    def _wait_booted(self, timeout: float) -> None:
        assert self._unshare is not None
        deadline = time.monotonic() + timeout
        up = self._unshare.pid
        while self.pid is None:
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{up}/task/{up}/children").read_text().split()
                if children:
                    self.pid = int(children[0])
                    break
            self._check_alive(deadline, "the namespace's first process")
            time.sleep(0.01)
        private = Path(f"/proc/{self.pid}/root/run/systemd/private")
        while True:
            with contextlib.suppress(OSError):
                if private.is_socket():
                    break
            self._check_alive(deadline, "systemd's private socket")
            time.sleep(0.02)
        left = max(1.0, deadline - time.monotonic())
        proc = self.run("systemctl", "is-system-running", "--wait", timeout=left)
        state = proc.stdout.strip()
        if state != "running":
            failed = self.run("systemctl", "--failed", "--no-legend").stdout
            raise TestbedError(
                f"testbed systemd is {state!r}, not running; failed units:\n{failed}\n"
                f"console:\n{self.console_tail()}"
            )

    def _check_alive(self, deadline: float, waiting_for: str) -> None:
        assert self._unshare is not None
        if self._unshare.poll() is not None:
            raise TestbedError(
                f"testbed exited (status {self._unshare.returncode}) before {waiting_for} "
                f"appeared; console:\n{self.console_tail()}"
            )
        if time.monotonic() > deadline:
            raise TestbedError(f"testbed: timed out waiting for {waiting_for}")

    def teardown(self, timeout: float = 15.0) -> None:
        """Power off (as a container, systemd exits), then remove the cgroup tree."""
        proc, self._unshare = self._unshare, None
        if proc is not None:
            if self.pid is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGRTMIN + 4)  # = systemctl poweroff
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # --kill-child: PID 1 and the namespace go with it
                proc.wait(10)
        self.pid = None
        # Empty once PID 1 is gone; the kernel may take a moment to notice.
        for _ in range(50):
            _rmdir_tree(self.cgroup)
            if not self.cgroup.exists():
                break
            time.sleep(0.1)

    def __enter__(self) -> Self:
        self.boot()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()

    # -- inside -----------------------------------------------------------------------

    def run(
        self, *argv: str, check: bool = False, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the testbed's mount and PID namespaces (so systemctl
        talks to its systemd and PIDs are the namespace's)."""
        if self.pid is None:
            raise TestbedError("testbed not booted")
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
        }
        proc = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "--", *argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise TestbedError(
                f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def systemctl(
        self, *args: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", *args, check=check, timeout=timeout)

    def show(self, unit: str, prop: str) -> str:
        """One property's value (`show -p A,B` prints in the unit's order: ask one)."""
        return self.systemctl("show", "-p", prop, "--value", unit).stdout.strip()

    def install_unit(self, name: str, text: str, reload: bool = True) -> None:
        if self.pid is None:
            raise TestbedError("testbed not booted")
        Path(f"/proc/{self.pid}/root/run/systemd/system", name).write_text(text)
        if reload:
            self.systemctl("daemon-reload")

    def remove_unit(self, name: str) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(FileNotFoundError):
            Path(f"/proc/{self.pid}/root/run/systemd/system", name).unlink()
        self.systemctl("daemon-reload", check=False)

    def journal(self, unit: str, lines: int = 300) -> str:
        """The unit's journal (messages only), including systemd's own lines about it."""
        proc = self.run(
            "journalctl", "-u", unit, "--no-pager", "-o", "short-monotonic", "-n", str(lines)
        )
        return proc.stdout + proc.stderr

    def console_tail(self, lines: int = 40) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])


def derive_unit(text: str, drop: tuple[str, ...] = (), **settings: str) -> str:
    """A unit file's text with [Service] settings replaced: every assignment of a key in
    `settings` or `drop` is removed and `settings` are appended at the end of [Service].
    Comments and every other line are kept as they are."""
    replaced = set(settings) | set(drop)
    out: list[str] = []
    section = ""
    key_re = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*=")

    def flush_service() -> None:
        while out and not out[-1].strip():
            out.pop()
        out.extend(f"{k}={v}" for k, v in settings.items())
        out.append("")

    for line in text.splitlines():
        header = re.match(r"^\s*\[(\w+)\]\s*$", line)
        if header:
            if section == "Service":
                flush_service()
            section = header[1]
        elif section == "Service":
            m = key_re.match(line)
            if m and m[1] in replaced:
                continue
        out.append(line)
    if section == "Service":
        flush_service()
    return "\n".join(out).rstrip() + "\n"
