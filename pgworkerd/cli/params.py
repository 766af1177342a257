"""Parameter types shared by the commands."""

from __future__ import annotations

from typing import Any

import click

from pgworkerd.durations import parse_duration


class DurationType(click.ParamType):
    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
