"""`pgworkerd web`: the dashboard (pgworkerd/web), and `pgworkerd web hash-password`."""

from __future__ import annotations

import dataclasses
import getpass
import importlib.util
import logging
import signal
import sys

import click
from setproctitle import setproctitle

from pgworkerd.cli import Context, fail, main
from pgworkerd.exitcodes import ExitCode


@main.group(invoke_without_command=True)
@click.option("--bind", help="address to listen on [default: the config's web.bind, 127.0.0.1]")
@click.option("--port", type=click.IntRange(0, 65535), help="[default: web.port, 8470]")
@click.option("--read-only", is_flag=True, help="pages only: no action offered or accepted")
@click.option(
    "--no-login",
    is_flag=True,
    help="serve without [web.users]: every local account can act (loopback only; "
    "[web] allow_anonymous)",
)
@click.pass_context
def web(
    click_ctx: click.Context, bind: str | None, port: int | None, read_only: bool, no_login: bool
) -> None:
    """Serve the web dashboard (needs `pip install 'pgworkerd[web]'`).

    Needs [web.users] (a login), unless --no-login says otherwise; listens on 127.0.0.1
    unless told otherwise, and any other address needs users (docs/operations/dashboard.md).
    Stops on SIGINT or SIGTERM.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    # the [web] extra: the daemon's own install has none of them
    needed = ("flask", "waitress", "psycopg_pool")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        fail(
            f"the dashboard needs Flask, waitress and psycopg-pool ({', '.join(missing)} not"
            " installed): pip install 'pgworkerd[web]'",
            ExitCode.CONFIG,
        )
    from pgworkerd.config import file_warnings
    from pgworkerd.ops import logs
    from pgworkerd.ops.systemd import Notifier
    from pgworkerd.web.server import BindRefused, build

    ctx: Context = click_ctx.obj
    config = ctx.config()
    settings = config.web
    if bind is not None:
        settings = dataclasses.replace(settings, bind=bind)
    if port is not None:
        settings = dataclasses.replace(settings, port=port)
    if read_only:
        settings = dataclasses.replace(settings, read_only=True)
    if no_login:
        if settings.users:
            fail("--no-login contradicts the config's [web.users]: remove one", ExitCode.CONFIG)
        settings = dataclasses.replace(settings, allow_anonymous=True)
    dsn = ctx.resolved_dsn()
    logs.setup(config.logging.format, config.logging.level)
    logs.hide_passwords_of(dsn, settings.action_dsn)
    for warning in file_warnings(config):
        logging.getLogger("pgworkerd.web").warning("%s", warning)
    try:
        dashboard = build(settings, dsn, ctx.schema)
    except BindRefused as exc:
        fail(str(exc), ExitCode.CONFIG)
    except OSError as exc:
        fail(f"cannot listen on {settings.bind}:{settings.port}: {exc.strerror}", ExitCode.CONFIG)
    mode = " (read-only)" if settings.read_only else ""
    login = "login required" if settings.users else "NO LOGIN (loopback only)"
    # Our own handlers, not KeyboardInterrupt: they only set a flag the serving loop reads
    # (see Dashboard), and they stop the server even when it was started with SIGINT
    # ignored: Python keeps an inherited SIG_IGN, so a server started from a
    # non-interactive shell's background job (or anything under one, such as a test run
    # started with `&`) never saw SIGINT at all. Without a handler SIGTERM killed it
    # outright, its pool and requests not closed.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, dashboard.request_stop)
    try:
        setproctitle(f"pgworkerd web: {dashboard.url}{mode}, {login}")
        if not settings.users:
            logging.getLogger("pgworkerd.web").warning(
                "web: serving WITHOUT A LOGIN (allow_anonymous / --no-login): every local "
                "account and every process on this host can read every job and act as the "
                "dashboard's database role; never put a proxy in front of it"
            )
        click.echo(f"pgworkerd web: serving {dashboard.url}{mode}, {login}", err=True)
        # Under systemd (Type=notify, systemd/pgworkerd-web.service): `systemctl start`
        # returns once the address is bound; a refused bind fails the start instead.
        Notifier().ready(f"serving {dashboard.url}{mode}")
        dashboard.run()
    finally:
        dashboard.close()


@web.command("hash-password")
def hash_password() -> None:
    """Read a password from stdin (asked twice on a terminal) and print its hash for
    [web.users]. The password never goes through argv, so `ps` and shell history never
    see it."""
    from pgworkerd.web.passwords import hash_password as make_hash

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            fail("the two passwords differ", ExitCode.CONFIG)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < 8:
        fail("the password must be at least 8 characters", ExitCode.CONFIG)
    click.echo(make_hash(password))
