"""What the CLI needs to show rows written by others: control characters escaped, and
loaders that never refuse a value the database holds.

Job rows come from applications and from the enqueuer role, so the CLI treats every text
field as hostile: an ESC sequence in a handler name must not retitle or clear the
operator's terminal, a newline must not forge a line of `pgworkerd jobs`, and a value
Python cannot hold (a timestamp of year 20000, a 5,000-digit JSON integer) must not turn a
read-only command into a traceback.
"""

from __future__ import annotations

import json
from typing import Any

import click

from pgworkerd.describe import printable
from pgworkerd.queue.safeloaders import RawJson, register_safe_loaders

__all__ = ["RawJson", "echo_json", "printable", "register_safe_loaders"]


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, sort_keys=True))
