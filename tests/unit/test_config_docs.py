"""Config declared once: every key's check, default and help come from its declaration;
the shipped example and reference are generated from them; every key's errors name the
file, line and key; check-config shows every table with its secrets masked."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgworkerd.config import Config, ConfigError, load_config, parse_config
from pgworkerd.config.docs import (
    EXAMPLE,
    REFERENCE,
    REGENERATE,
    render_example,
    render_reference,
    toml_value,
)
from pgworkerd.config.model import TABLES
from pgworkerd.config.spec import UNSET, Key, Table
from pgworkerd.web.passwords import hash_password

REPO = Path(__file__).resolve().parents[2]
PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))

EVERY_KEY = [
    pytest.param(table, k, id=f"{table.name}.{k.name}")
    for table in TABLES
    for k in table.declared()
]


@pytest.mark.parametrize(
    ("name", "render"), [(EXAMPLE, render_example), (REFERENCE, render_reference)]
)
def test_shipped_files_are_the_generated_ones(name: str, render: Any) -> None:
    shipped = (REPO / name).read_text(encoding="utf-8") if (REPO / name).is_file() else ""
    assert shipped == render(), f"{name} differs from the key declarations: run `{REGENERATE}`"


def test_the_generator_checks_and_rewrites_a_checkout(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tmp_path / EXAMPLE).write_text("# hand-edited\n")

    def docs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgworkerd.config.docs", *args, "--root", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    proc = docs("--check")
    assert proc.returncode == 1
    assert f"{EXAMPLE} differs from the declarations: run `{REGENERATE}`" in proc.stderr
    assert f"{REFERENCE} differs" in proc.stderr
    assert docs("--write").returncode == 0
    assert (tmp_path / EXAMPLE).read_text() == render_example()
    assert (tmp_path / REFERENCE).read_text() == render_reference()
    assert docs("--check").returncode == 0


@pytest.mark.parametrize(("table", "k"), EVERY_KEY)
def test_every_key_is_declared_with_help_a_check_and_a_writable_default(
    table: Table, k: Key
) -> None:
    assert k.help.strip() and k.help.endswith((".", ")")), k.help
    assert k.check.allowed
    if k.required or k.written(k.default) is None:  # the example must show its form
        assert k.example is not UNSET
    if not k.required:
        # What the example writes reads back as the default the code uses.
        written = k.written(k.default)
        if written is not None:
            assert k.check(written) == k.default
    if k.example is not UNSET and (table.name, k.name) != ("web", "users"):
        assert k.check(k.written(k.example)) == k.example
    # (web.users' example is a placeholder, not a hash anyone could log in with)


@pytest.mark.parametrize(("table", "k"), EVERY_KEY)
def test_every_key_is_in_the_example_and_the_reference(table: Table, k: Key) -> None:
    example, reference = render_example(), render_reference()
    assert f"\n{k.name} = " in example or f"\n# {k.name} = " in example
    header = f"{table.name}.NAME" if table.named else table.name
    section = reference[reference.index(f"## [{header}]") :]
    entry = section[section.index(f"### {header}.{k.name}\n") :]
    assert f"- Allowed: {k.check.allowed}" in entry.split("\n###")[0]


def test_the_example_reads_back_as_the_defaults() -> None:
    config = load_config(REPO / EXAMPLE)
    defaults = Config()
    for table in TABLES:
        if not table.named:
            assert getattr(config, table.name) == getattr(defaults, table.name), table.name
    handler = config.handlers["sleep_with_progress"]
    assert dataclasses.replace(handler, name="x") == dataclasses.replace(
        parse_config('[handlers.x]\ntarget = "pgworkerd.examples:sleep_with_progress"\n').handlers[
            "x"
        ],
        name="x",
    )


def _minimal(table: Table, *, but: str = "") -> str:
    """The keys a table cannot go without (but `but`), with their examples."""
    lines = [
        f"{r.name} = {toml_value(r.written(r.example))}\n"
        for r in table.declared()
        if r.required and r.name != but
    ]
    if table.name == "schedules" and but not in ("cron", "every"):
        # exactly one of cron and every; a timezone only with cron
        lines.append('cron = "0 3 * * *"\n' if but == "timezone" else 'every = "1m"\n')
    return "".join(lines)


def _wrong_value(k: Key) -> str:
    """A TOML value of the wrong kind for `k`."""
    return "5" if isinstance(k.default, dict) or k.name == "payload" else "{ x = 1 }"


@pytest.mark.parametrize(("table", "k"), EVERY_KEY)
def test_a_wrong_value_of_every_key_names_file_line_and_key(table: Table, k: Key) -> None:
    """One generic reader for every key: a value of the wrong kind is refused naming the
    file, the key's line and the key, and saying what was given (never a table's
    content, which may hold a password)."""
    header = f"{table.name}.t" if table.named else table.name
    required = _minimal(table, but=k.name)
    text = f"[{header}]\n{required}{k.name} = {_wrong_value(k)}\n"
    line = 2 + len(required.splitlines())
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/pgworkerd.toml")
    message = str(info.value)
    assert message.startswith(f"/etc/pgworkerd.toml:{line}: {header}.{k.name}: "), message
    assert "x = 1" not in message and "\n" not in message


def test_unknown_keys_of_every_table_are_named_with_the_known_ones() -> None:
    for table in TABLES:
        header = f"{table.name}.t" if table.named else table.name
        required = _minimal(table)
        with pytest.raises(ConfigError) as info:
            parse_config(f"[{header}]\n{required}colour = 1\n", "c.toml")
        known = ", ".join(sorted(table.key_names()))
        assert str(info.value) == (
            f"c.toml:{2 + len(required.splitlines())}: {header}.colour: unknown key "
            f"(known keys here: {known})"
        )


def test_check_config_prints_every_table_with_secrets_masked(tmp_path: Path) -> None:
    hashed = hash_password("a long enough password")
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[database]\ndsn = "postgresql://app:Db-Pw1@db/app"\n'
        "[logs]\nforward_lines_per_second = 7\n"
        '[web]\naction_dsn = "host=db user=op password=Act-Pw2"\nidle_timeout = "10m"\n'
        f'[web.users]\nalice = "{hashed}"\n'
        '[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n'
        '[schedules.nightly]\ncron = "0 3 * * *"\nhandler = "echo"\npayload = { kind = "full" }\n'
    )
    cfg.chmod(0o600)
    proc = subprocess.run(
        [PGWORKERD, "--config", str(cfg), "check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for secret in ("Db-Pw1", "Act-Pw2", hashed, hashed.split("$")[-1]):
        assert secret not in out + proc.stderr
    for table in TABLES:
        if not table.named:
            section = out[out.index(f"[{table.name}]\n") :].split("\n[")[0]
            for k in table.declared():  # every key, with a value or said unset
                assert f"\n{k.name} = " in section or f"\n# {k.name}: not set" in section, (
                    table.name,
                    k.name,
                )
    assert "\nforward_lines_per_second = 7\n" in out
    assert '\nusers = ["alice"]\n' in out  # names only
    assert '\naction_dsn = "host=db user=op password=***"\n' in out
    assert "\nidle_timeout = 600.0\n" in out
    nightly = out[out.index("[schedules.nightly]\n") :]
    assert '\ncron = "0 3 * * *"\n' in nightly and '\nqueue = "default"\n' in nightly
    assert '\npayload = {"kind": "full"}\n' in nightly
    assert "\n# memory_limit: not set\n" in out
    data = json.loads(
        subprocess.run(
            [PGWORKERD, "--config", str(cfg), "check-config", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
    assert data["web"]["users"] == ["alice"] and "Act-Pw2" not in json.dumps(data)
    assert data["schedules"]["nightly"]["cron"] == "0 3 * * *"


@pytest.mark.parametrize("table", ["handlers", "schedules"])
def test_a_named_table_cannot_rename_itself(table: str) -> None:
    """`name` is the table's NAME, not a key: it used to be accepted and ignored."""
    required = 'target = "m:f"\n' if table == "handlers" else 'handler = "h"\nevery = "1m"\n'
    with pytest.raises(ConfigError, match=rf"^c\.toml:2: {table}\.t\.name: unknown key"):
        parse_config(f'[{table}.t]\nname = "other"\n{required}', "c.toml")
