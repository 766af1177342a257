"""`pgworkerd payload-schema`: the JSON Schema of each typed handler's payload
(pgworkerd.typed), for code in other languages that enqueues jobs. (Not `schema`: the
global --schema names the PostgreSQL schema.)"""

from __future__ import annotations

from typing import Any

import click

from pgworkerd.cli import Context, fail, main
from pgworkerd.cli.display import echo_json
from pgworkerd.config import ConfigError
from pgworkerd.exitcodes import ExitCode


@main.command("payload-schema")
@click.argument("handlers", nargs=-1)
@click.pass_obj
def payload_schema(ctx: Context, handlers: tuple[str, ...]) -> None:
    """Print the JSON Schema (2020-12) of typed handlers' payloads, from the config's
    handlers (their modules are imported, as check-config does).

    With one HANDLER: its schema. Otherwise a JSON object of handler name -> schema, for
    the HANDLERs given or every typed handler of the config. A handler without a typed
    payload (its second parameter annotated with a dataclass or a Pydantic model) named
    here exits 1; an unknown name is a bad command line (exit 2).
    """
    from pgworkerd.config import import_handler
    from pgworkerd.typed import schema

    if not ctx.config_path:
        raise click.UsageError("give the config file with --config (or PGWORKERD_CONFIG)")
    config = ctx.config()
    for name in handlers:
        if name not in config.handlers:
            known = ", ".join(sorted(config.handlers)) or "none"
            raise click.BadParameter(
                f"no handler {name!r} in {config.path} (its handlers: {known})",
                param_hint="HANDLERS",
            )
    schemas: dict[str, Any] = {}
    for name in handlers or sorted(config.handlers):
        try:
            found = schema(import_handler(config.handlers[name]))
        except ConfigError as exc:
            fail(str(exc), ExitCode.HANDLER)
        if found is not None:
            schemas[name] = found
        elif handlers:
            fail(
                f"handler {name!r} declares no typed payload (annotate its second parameter "
                "with a dataclass or a Pydantic model)",
                ExitCode.FAILURE,
            )
    echo_json(schemas[handlers[0]] if len(handlers) == 1 else schemas)
