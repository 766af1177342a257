"""Throwaway local PostgreSQL clusters for the test suite, the benchmarks and `pgworkerd demo`.

A cluster lives entirely inside one directory (data, unix socket, server log, passfile) and
listens on its own port, so several can run at once (one per pytest-xdist worker), and a run
that was killed leaves nothing that the next run could trip over.

Private to the user who started it: its directory (and the socket directory in it) is closed
to everyone but that user and the account running the server, and every connection, over
the socket or TCP on 127.0.0.1, must prove a random password (scram-sha-256). The password
sits in a 0600 passfile that the DSNs name (`passfile=`), so it never appears in a DSN, an
argv or a log.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

# Default base dirs live directly under /tmp: unix socket paths are limited to ~107 bytes,
# and /tmp is searchable by the unprivileged server user when we are root.
_TMP = Path("/tmp")
_PREFIX = "pgworkerd-pg-"
_LOCK_NAME = "owner.lock"
_PASSFILE_NAME = "passfile"
_SERVER_USER = "postgres"
# Replaces initdb's pg_hba.conf: no trust anywhere, the password from the passfile everywhere.
_PG_HBA = """\
# pgworkerd.devcluster.localpg: a private throwaway cluster. Every connection proves the random
# password kept in the owner's 0600 passfile; the socket directory is closed to other users.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
# streaming replication (a standby made with LocalPostgres(standby_of=...)), same password
local replication all scram-sha-256
host  replication all 127.0.0.1/32 scram-sha-256
"""

log = logging.getLogger(__name__)


class LocalPostgresError(RuntimeError):
    """The server binaries are missing or initdb/pg_ctl failed."""


def _version_key(bindir: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin: compare "9.6" < "15" numerically, not as text.
    return tuple(int(n) for n in re.findall(r"\d+", bindir.parent.name))


def find_server_bindir() -> Path:
    """Return the directory holding `postgres`, `initdb` and `pg_ctl` (newest version wins)."""
    found = sorted(
        (p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/postgres")),
        key=_version_key,
    )
    if found:
        return found[-1]
    # Non-Debian layouts. pg_config alone is not enough: libpq-dev ships it without a server.
    pg_config = shutil.which("pg_config")
    if pg_config:
        proc = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        bindir = Path(proc.stdout.strip())
        if proc.returncode == 0 and (bindir / "postgres").is_file():
            return bindir
    raise LocalPostgresError(
        "PostgreSQL server binaries not found; install Debian's `postgresql` package"
    )


def _server_account() -> pwd.struct_passwd | None:
    """The account to run initdb/postgres as, or None to run them as ourselves.

    Both refuse to run as root, and CI runs as root: there we use the `postgres` system
    user, creating it if the machine has none.
    """
    if os.geteuid() != 0:
        return None
    for _ in range(10):
        try:
            return pwd.getpwnam(_SERVER_USER)
        except KeyError:
            pass
        # Several xdist workers may race here; a loser fails on the passwd lock or because
        # the user now exists, so just look again.
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                _SERVER_USER,
            ],
            capture_output=True,
            check=False,
        )
        time.sleep(0.1)
    raise LocalPostgresError(f"could not create the {_SERVER_USER!r} system user")


def _clean_env() -> dict[str, str]:
    # PGDATA, PGPORT, PGOPTIONS... from the caller's shell must not steer our cluster.
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _run(
    args: list[str | Path],
    cwd: Path,
    account: pwd.struct_passwd | None,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    if prefix:
        # The prefix (e.g. `ip netns exec NAME`) runs as ourselves (it needs root), and
        # runuser switches to the server account after it.
        switch = ["runuser", "-u", account.pw_name, "--"] if account else []
        args = [*prefix, *switch, *args]
        account = None
    # subprocess's user/group switch (instead of runuser/su) needs no extra binary and
    # drops root's supplementary groups too.
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,  # the server user may not be able to enter our cwd (e.g. /root)
        env=_clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        user=account.pw_uid if account else None,
        group=account.pw_gid if account else None,
        extra_groups=[] if account else None,
    )


def _check_reachable(path: Path, account: pwd.struct_passwd) -> None:
    # Fail early and clearly rather than with initdb's "Permission denied" when a parent
    # (e.g. pytest's 0700 /tmp/pytest-of-root) keeps the server user out. We do not chmod
    # the caller's directories.
    for d in path.parents:
        st = d.stat()
        if st.st_uid == account.pw_uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == account.pw_gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            raise LocalPostgresError(
                f"{path} is not reachable by the {account.pw_name!r} user that runs the "
                f"server: {d} has mode {st.st_mode & 0o777:o}; use a base_dir under /tmp"
            )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _write_private_file(path: Path, text: str, account: pwd.struct_passwd | None) -> None:
    """Create `path` (0600, owned by `account` or us) holding `text`; never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if account:
            os.fchown(fd, account.pw_uid, account.pw_gid)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _reap_abandoned(bindir: Path, account: pwd.struct_passwd | None) -> None:
    """Stop and delete default clusters whose owner died without cleaning up (SIGKILL, OOM).

    Owners hold an flock on <base_dir>/owner.lock for their whole life and the kernel drops
    it however the process dies, so a lock we can take means nobody owns the cluster. A lock
    rather than a PID file because owners may live in other PID namespaces sharing /tmp.
    Anyone can create /tmp/pgworkerd-pg-*: only directories of ours with the layout we make
    are touched (also when root), and no symlink is ever followed.
    """
    for base in _TMP.glob(f"{_PREFIX}*"):
        try:
            dir_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone, or not a directory (a symlink gives ELOOP): not one of ours
        try:
            _reap_one(base, dir_fd, bindir, account)
        finally:
            os.close(dir_fd)


def _reap_one(base: Path, dir_fd: int, bindir: Path, account: pwd.struct_passwd | None) -> None:
    me = os.geteuid()
    st = os.fstat(dir_fd)
    if st.st_uid != me:
        # Usually another user's own cluster: normal, so only at debug level.
        log.debug("leaving %s alone: owned by uid %d, not by us (uid %d)", base, st.st_uid, me)
        return
    # Nobody else may write in it, so what we check below cannot be swapped afterwards
    # (and /tmp's sticky bit keeps others from renaming the directory itself).
    if st.st_mode & 0o022:
        log.warning("leaving %s alone: writable by others (mode %o)", base, st.st_mode & 0o777)
        return
    try:
        lock_fd = os.open(_LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return  # still being created (the lock is renamed into place) or not ours
    except OSError as exc:
        log.warning("leaving %s alone: cannot open %s: %s", base, _LOCK_NAME, exc.strerror)
        return
    try:
        lock = os.fstat(lock_fd)
        if not stat.S_ISREG(lock.st_mode) or lock.st_uid != me:
            log.warning("leaving %s alone: %s is not our regular file", base, _LOCK_NAME)
            return
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its owner is alive
        try:
            data = os.stat("data", dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            data = None
        if data is not None:
            server_uid = account.pw_uid if account else me
            if not stat.S_ISDIR(data.st_mode) or data.st_uid != server_uid:
                what = "a symlink" if stat.S_ISLNK(data.st_mode) else f"owned by uid {data.st_uid}"
                log.warning("leaving %s alone: its data is %s, not our cluster", base, what)
                return
            with contextlib.suppress(FileNotFoundError):
                os.stat("data/postmaster.pid", dir_fd=dir_fd, follow_symlinks=False)
                _run(
                    [bindir / "pg_ctl", "stop", "-m", "immediate", "-w", "-D", base / "data"],
                    _TMP,
                    account,
                )
        # rmtree removes links, never what they point to.
        shutil.rmtree(base, ignore_errors=True)
    finally:
        os.close(lock_fd)


class LocalPostgres:
    """A private PostgreSQL cluster: `with LocalPostgres() as pg: psycopg.connect(pg.dsn())`."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        command_prefix: tuple[str, ...] = (),
        standby_of: LocalPostgres | None = None,
        standby_name: str = "standby",
    ) -> None:
        """`command_prefix` runs pg_ctl (and so the server) under a command, e.g.
        ("ip", "netns", "exec", "NAME") to put the server in a network namespace.

        With `standby_of`, the first start makes a streaming standby of that (running)
        cluster with pg_basebackup instead of running initdb; it has the primary's roles
        and so its password, and reports `standby_name` as its application_name (what
        the primary's synchronous_standby_names names). promote() makes it a primary."""
        self.command_prefix = tuple(command_prefix)
        self.standby_of, self.standby_name = standby_of, standby_name
        self.bindir = find_server_bindir()
        self._account = _server_account()
        self._lock_fd: int | None = None
        if base_dir is None:
            _reap_abandoned(self.bindir, self._account)
            self.base_dir = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=_TMP))
            self._take_ownership_lock()
        else:
            self.base_dir = Path(base_dir).absolute()
            self.base_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "sock"
        self.log_file = self.base_dir / "postgres.log"
        self.passfile = self.base_dir / _PASSFILE_NAME
        self._make_private_layout()
        self._password = self._load_or_make_password()
        # An auto-picked port may be grabbed by someone else before the server binds it;
        # start() then retries with another one.
        self._auto_port = port is None
        self.port = port if port is not None else _free_port()
        self.settings: dict[str, str] = {
            # fsync=off only risks data on an OS crash. synchronous_commit stays on: with it
            # off, crash() loses the last ~0.5 s of commits, and with fsync=off it buys no
            # speed (measured: 5000 single-row commits 0.45 s off vs 0.37 s on).
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "128MB",
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.socket_dir),
            "logging_collector": "off",
            **(settings or {}),
        }

    def _make_private_layout(self) -> None:
        """base_dir and sock/ are ours; others may not even enter them.

        As root the server runs as `postgres`, which gets in through the group: base_dir
        root:postgres 0750, sock/ root:postgres 0770 (it creates its socket there), data/
        and the log postgres-owned 0700/0600. Root connects as the owner, so this holds
        even for a root without CAP_DAC_OVERRIDE (the hardened unit in
        tests/acceptance/test_systemd.py).
        """
        account = self._account
        self.socket_dir.mkdir(exist_ok=True)
        if account is None:
            self.base_dir.chmod(0o700)
            self.socket_dir.chmod(0o700)
            return
        _check_reachable(self.base_dir, account)
        for d, mode in ((self.base_dir, 0o750), (self.socket_dir, 0o770)):
            os.chown(d, os.geteuid(), account.pw_gid)
            d.chmod(mode)
        # The server account cannot create entries in base_dir: make its two for it.
        if not self.data_dir.exists():
            self.data_dir.mkdir(mode=0o700)
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
        if not self.log_file.exists():
            _write_private_file(self.log_file, "", account)

    def _load_or_make_password(self) -> str:
        try:
            st = self.passfile.lstat()
        except FileNotFoundError:
            if (self.data_dir / "PG_VERSION").exists():
                raise LocalPostgresError(
                    f"{self.data_dir} holds a cluster made without a passfile (before clusters "
                    "were private); delete it so a private one is made"
                ) from None
            # [A-Za-z0-9_-]: nothing to escape below. A standby's roles are its primary's.
            password = self.standby_of.password if self.standby_of else secrets.token_urlsafe(24)
            # Any host, port, database and role: also serves a PgBouncer in front of it.
            _write_private_file(self.passfile, f"*:*:*:*:{password}\n", None)
            return password
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise LocalPostgresError(f"{self.passfile} is not our regular file; not using it")
        return self.passfile.read_text().strip().rsplit(":", 1)[-1]

    def _take_ownership_lock(self) -> None:
        # Lock a temp name, then rename: the reaper never sees an owner.lock nobody holds.
        tmp = self.base_dir / (_LOCK_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, self.base_dir / _LOCK_NAME)
        self._lock_fd = fd

    # -- process control -------------------------------------------------------------

    def _pg_ctl(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return _run(
            [self.bindir / "pg_ctl", *args, "-D", self.data_dir],
            self.base_dir,
            self._account,
            self.command_prefix,
        )

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except FileNotFoundError:
            return 0

    def _log_since(self, offset: int, max_lines: int = 30) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(offset)
                lines = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no server log)"
        return "\n".join(lines[-max_lines:])

    def _fail(
        self, what: str, proc: subprocess.CompletedProcess[str], log_offset: int
    ) -> LocalPostgresError:
        output = (proc.stdout + proc.stderr).strip()
        return LocalPostgresError(
            f"{what} failed (exit {proc.returncode}) for {self.data_dir}:\n{output}\n"
            f"--- tail of {self.log_file} ---\n{self._log_since(log_offset)}"
        )

    def _initdb(self) -> None:
        # initdb reads the superuser's password from a file (never argv); the server
        # account must be able to read it, so it gets a copy of its own for the moment.
        pwfile = self.base_dir / "initdb.pw"
        pwfile.unlink(missing_ok=True)
        _write_private_file(pwfile, self._password + "\n", self._account)
        try:
            proc = _run(
                [
                    self.bindir / "initdb",
                    "-D",
                    self.data_dir,
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--username=postgres",
                    "--encoding=UTF8",
                    "--no-sync",
                    # The C locale exists everywhere; the caller's LANG may name one that doesn't.
                    "--locale=C",
                ],
                self.base_dir,
                self._account,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise self._fail("initdb", proc, self._log_size())
        (self.data_dir / "pg_hba.conf").write_text(_PG_HBA)
        # Appended last in postgresql.conf, so these override initdb's defaults.
        lines = [f"{k} = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in self.settings.items()]
        with (self.data_dir / "postgresql.conf").open("a") as f:
            f.write("\n# pgworkerd.devcluster.localpg\n" + "\n".join(lines) + "\n")

    def _basebackup(self, primary: LocalPostgres) -> None:
        """Copy `primary` into data_dir and configure it as its streaming standby."""
        # The server account reads this passfile (pg_basebackup, then the WAL receiver's
        # primary_conninfo): a copy of its own, like initdb's pwfile.
        server_passfile = self.base_dir / "server.passfile"
        if not server_passfile.exists():
            _write_private_file(server_passfile, f"*:*:*:*:{self._password}\n", self._account)
        conninfo = make_conninfo(
            "",
            host=str(primary.socket_dir),
            port=str(primary.port),
            user="postgres",
            passfile=str(server_passfile),
            application_name=self.standby_name,
        )
        proc = _run(
            [
                self.bindir / "pg_basebackup",
                "-D",
                self.data_dir,
                "-d",
                conninfo,
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            self.base_dir,
            self._account,
        )
        if proc.returncode != 0:
            raise self._fail("pg_basebackup", proc, self._log_size())
        # The primary's postgresql.conf came along: our own settings go after its lines,
        # so they win (its socket directory above all).
        settings = {**self.settings, "primary_conninfo": conninfo}
        lines = [f"{k} = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in settings.items()]
        with (self.data_dir / "postgresql.conf").open("a") as f:
            f.write("\n# pgworkerd.devcluster.localpg standby\n" + "\n".join(lines) + "\n")
        _write_private_file(self.data_dir / "standby.signal", "", self._account)

    def promote(self) -> None:
        """Make a standby a primary; waits until it accepts writes."""
        offset = self._log_size()
        proc = self._pg_ctl("promote", "-w", "-t", "60")
        if proc.returncode != 0:
            raise self._fail("pg_ctl promote", proc, offset)

    def start(self) -> None:
        """initdb on first use, then start and wait until the server accepts connections."""
        if self.is_running():
            return
        if not (self.data_dir / "PG_VERSION").exists():
            if self.standby_of is not None:
                self._basebackup(self.standby_of)
            else:
                self._initdb()
        for attempt in range(5):
            offset = self._log_size()
            # -l sends the postmaster's output to the log, so it does not hold our pipes open.
            proc = self._pg_ctl(
                "start", "-w", "-t", "60", "-l", self.log_file, "-o", f"-p {self.port}"
            )
            if proc.returncode == 0:
                return
            if self._auto_port and attempt < 4 and "could not bind" in self._log_since(offset):
                self.port = _free_port()
                continue
            raise self._fail("pg_ctl start", proc, offset)

    def stop(self, mode: str = "fast") -> None:
        if not self.is_running():
            return
        offset = self._log_size()
        proc = self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)
        if proc.returncode != 0:
            raise self._fail(f"pg_ctl stop -m {mode}", proc, offset)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def crash(self) -> None:
        """Stop like a server crash: no shutdown checkpoint, so the next start runs recovery."""
        self.stop("immediate")

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        # Exit status 0 = running, 3 = not running.
        return self._pg_ctl("status").returncode == 0

    # -- connecting ------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """Over the unix socket; the password comes from the passfile, never the DSN."""
        return make_conninfo(
            "",
            host=str(self.socket_dir),
            port=str(self.port),
            user=user,
            dbname=dbname,
            passfile=str(self.passfile),
        )

    def tcp_dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return make_conninfo(
            "",
            host="127.0.0.1",
            port=str(self.port),
            user=user,
            dbname=dbname,
            passfile=str(self.passfile),
        )

    @property
    def password(self) -> str:
        """For what cannot read a passfile (e.g. PgBouncer's auth_file). Never put it in a
        DSN, an argv or a log: use dsn()/tcp_dsn(), which name the passfile."""
        return self._password

    def grant_login(self, role: str) -> None:
        """Let `role` log in with the cluster's password, so `dsn(user=role)` works."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            # Only the SCRAM verifier goes to the server, so no statement or server log
            # can show the password.
            verifier = conn.pgconn.encrypt_password(
                self._password.encode(), role.encode(), b"scram-sha-256"
            )
            conn.execute(
                sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(verifier.decode())
                )
            )

    def create_database(self, name: str) -> None:
        # CREATE DATABASE cannot run in a transaction block, hence autocommit.
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # lost a race
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    # -- lifetime --------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop the server (immediately: its data is about to go) and delete base_dir."""
        try:
            self.crash()
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
