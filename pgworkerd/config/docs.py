"""config.example.toml and docs/reference/configuration.md, generated from the key
declarations, so the example, the reference and the code cannot drift apart.

    python -m pgworkerd.config.docs --write    # rewrite both files of this checkout
    python -m pgworkerd.config.docs --check    # exit 1 when a shipped file differs

tests/unit/test_config_docs.py fails when the shipped files differ from these texts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from pgworkerd.config import checks
from pgworkerd.config.model import TABLES
from pgworkerd.config.relations import RULES
from pgworkerd.config.spec import UNSET, Key, Table

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "config.example.toml"
REFERENCE = "docs/reference/configuration.md"
REGENERATE = "python -m pgworkerd.config.docs --write"

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_value(value: Any) -> str:
    """A value in TOML's inline syntax (the example's and the reference's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        pairs = (
            f"{k if _BARE_KEY.match(k) else json.dumps(k)} = {toml_value(v)}"
            for k, v in value.items()
        )
        return "{ " + ", ".join(pairs) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _comment(text: str, prefix: str = "# ") -> list[str]:
    return textwrap.wrap(
        text,
        width=88,
        initial_indent=prefix,
        subsequent_indent=prefix,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _example_line(k: Key) -> tuple[bool, str]:
    """(commented out, `key = value`): the example value when one is declared (a
    suggestion: the key is unset or empty by default), else the default."""
    if k.example is not UNSET:
        return not k.required, f"{k.name} = {toml_value(k.written(k.example))}"
    written = k.written(k.default)
    if written is None:
        raise ValueError(f"{k.name}: unset by default, so it needs an example")
    return False, f"{k.name} = {toml_value(written)}"


def _example_table(table: Table) -> list[str]:
    lines = ["", *_comment(table.help)]
    header = f"[{table.name}.{table.example}]" if table.named else f"[{table.name}]"
    lines.append(f"# {header}" if table.commented else header)
    for k in table.declared():
        plain = k.check in (checks.string, checks.boolean)  # nothing to add to the value
        lines.extend(_comment(k.help if plain else f"{k.help} Allowed: {k.check.allowed}."))
        commented, line = _example_line(k)
        lines.append(f"# {line}" if commented or table.commented else line)
    if table.extra:
        lines.extend(["", *table.extra.rstrip("\n").splitlines()])
    return lines


def _in_file_order() -> list[Table]:
    """The tables as the file shows them: the single ones, then the named ones (their
    [handlers.NAME] tables, once begun, run to the end of a file)."""
    return sorted(TABLES, key=lambda t: t.named)


def render_example() -> str:
    """The text of config.example.toml."""
    lines = [
        "# pgworkerd configuration. Every key is shown with its default; a key commented out",
        "# shows an example of its form. Durations are written like 250ms, 30s, 10m, 1h30m",
        "# or as plain seconds; sizes like 512MiB or 2GiB. Unknown keys are errors.",
        "# Validate with:  pgworkerd --config /etc/pgworkerd/pgworkerd.toml check-config",
        f"# Reference: {REFERENCE}. Generated from the declarations in",
        f"# pgworkerd/config ({REGENERATE}).",
    ]
    for table in _in_file_order():
        lines.extend(_example_table(table))
    return "\n".join(lines) + "\n"


def _default_text(k: Key) -> str:
    if k.required:
        return "required"
    written = k.written(k.default)
    if written is None:
        return "unset"
    return f"`{toml_value(written)}`"


def _header(table: Table) -> str:
    return f"{table.name}.NAME" if table.named else table.name


def _slug(heading: str) -> str:
    """A heading's anchor, as MkDocs and GitHub make it: "[handlers.NAME]" -> "handlersname"."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def render_reference() -> str:
    """The text of docs/reference/configuration.md."""
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from pgworkerd/config by `{REGENERATE}`:",
        "edit the declarations there, not this file. -->",
        "",
        "pgworkerd reads one TOML file, given with `--config FILE` (or `PGWORKERD_CONFIG`).",
        "Every key is optional unless marked required; unknown tables and keys are errors.",
        "An error names the file, the line, the key, what is wrong and what is allowed:",
        "`pgworkerd.toml:12: worker.lease: must be longer than zero, got '0s'`.",
        "`pgworkerd --config FILE check-config` validates the file, imports every handler",
        "and prints the effective value of every key (passwords and password hashes",
        "masked). `pgworkerd files config.example.toml` prints an example with every key.",
        "",
        "Durations are written `250ms`, `30s`, `10m`, `1h30m`, `7d` or as plain seconds;",
        "sizes `512MiB`, `2GiB` (binary units; `GB` means GiB).",
        "",
        *textwrap.wrap(
            "Tables: "
            + ", ".join(f"[`[{_header(t)}]`](#{_slug(_header(t))})" for t in _in_file_order())
            + "; and [the relations between keys](#relations-between-keys).",
            width=88,
            break_on_hyphens=False,
        ),
    ]
    for table in _in_file_order():
        header = _header(table)
        lines.extend(["", f"## [{header}]", ""])
        lines.extend(textwrap.wrap(table.help, width=88, break_on_hyphens=False))
        for k in table.declared():
            lines.extend(["", f"### {header}.{k.name}", ""])
            lines.extend(textwrap.wrap(k.help, width=88, break_on_hyphens=False))
            lines.extend(["", f"- Allowed: {k.check.allowed}", f"- Default: {_default_text(k)}"])
            if k.example is not UNSET:
                lines.append(f"- Example: `{k.name} = {toml_value(k.written(k.example))}`")
    lines.extend(["", "## Relations between keys", ""])
    lines.append("Checked when the file is read, after each key's own check:")
    lines.append("")
    for rule in RULES:
        lines.extend(textwrap.wrap(rule, width=88, initial_indent="- ", subsequent_indent="  "))
    return "\n".join(lines) + "\n"


GENERATED = {EXAMPLE: render_example, REFERENCE: render_reference}


def stale(root: Path = REPO) -> list[str]:
    """The generated files under `root` whose text differs from what is generated."""
    found = []
    for name, render in GENERATED.items():
        path = root / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render():
            found.append(name)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pgworkerd.config.docs",
        description=f"Generate {EXAMPLE} and {REFERENCE} from the key declarations.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite both files")
    action.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to write in")
    args = parser.parse_args(argv)
    if not (args.root / "pyproject.toml").is_file():
        parser.error(f"{args.root} is not a pgworkerd checkout (no pyproject.toml)")
    if args.check:
        found = stale(args.root)
        for name in found:
            print(f"{name} differs from the declarations: run `{REGENERATE}`", file=sys.stderr)
        return 1 if found else 0
    for name, render in GENERATED.items():
        path = args.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
