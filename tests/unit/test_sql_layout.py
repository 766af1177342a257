"""Where SQL lives and what it is called (docs/development/sql.md), checked on the files.

Static, no database: the declared schema (pgworkerd/queue/sql/objects/), the statements
(sql/queries/) and the migrations are read as text. Whether the declaration equals the
migrations is tests/integration/test_migrate.py's question.

The naming rule, as far as text can check it:
  - a function is entity_verb: its name starts with a table's name (singular or plural)
    and says what it does after it; `_vN` (N >= 2) only for a successor, whose
    predecessor some migration created; no `_v1`;
  - indexes, triggers and named constraints start with their table's name (indexes end
    in `_idx`);
  - a statement is entity_verb too, and lives in the file of its entity;
  - every object of compat.sql names the code that needs it and the migration that may
    drop it.
Names from before the rule are listed below, each with its reason: a function's name is
part of its callers' contract, so renaming one means a new function and a compatibility
entry, which is not worth it for a name alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgworkerd.queue import migrate, queries

SQL = Path(__file__).resolve().parents[2] / "pgworkerd" / "queue" / "sql"
OBJECTS = SQL / "objects"
STATEMENTS = SQL / "queries"
MIGRATIONS = SQL / "migrations"

_FUNCTION_RE = re.compile(r"^CREATE FUNCTION @schema@\.(\w+)\(", re.MULTILINE)
_TABLE_RE = re.compile(r"^CREATE TABLE @schema@\.(\w+) \(", re.MULTILINE)
_INDEX_RE = re.compile(r"^CREATE (?:UNIQUE )?INDEX (\w+)\s+ON @schema@\.(\w+)", re.MULTILINE)
_TRIGGER_RE = re.compile(
    r"^CREATE TRIGGER (\w+)\s.*?\bON @schema@\.(\w+)", re.MULTILINE | re.DOTALL
)
_VERSION_RE = re.compile(r"^(\w+?)_v(\d+)$")

# Function names from before the rule, by reason. Each still exists (a test checks), so
# the list shrinks as contract migrations drop them.
NAMED_BEFORE_THE_RULE: dict[str, tuple[str, ...]] = {
    # The SQL API of workers in other languages (README "Jobs"), verb_noun, since 0.1-0.3.
    "claim and finish API for other languages": (
        "claim",
        "claim_v2",
        "claim_v3",
        "claim_jobs",
        "renew_lease",
        "complete_job",
        "fail_job",
        "release_job",
        "snooze_job",
        "give_up_job",
    ),
    # The daemon's fenced functions (0022), named after their one-job siblings above.
    "the daemon's fenced functions, named like the API above": (
        "renew_leases",
        "complete_jobs",
        "cancel_held_job",
        "snooze_held_job",
    ),
    # enqueue is the application API since 0.1; the _v2 functions take a concurrency key:
    # a variant, not a successor (named before the rule said so). Their helpers share
    # the prefix.
    "enqueue API since 0.1, its variants and helpers": (
        "enqueue",
        "enqueue_many",
        "enqueue_reject",
        "enqueue_v2",
        "enqueue_many_v2",
        "enqueue_reject_v2",
        "enqueue_name_ok",
        "enqueue_valid",
        "readable",
        "concurrency_key_problem",
    ),
    # The operators' API (README "Pause and resume", "Drain, resume, status").
    "operator API, verb first": (
        "pause",
        "resume",
        "pause_queue",
        "resume_queue",
        "pause_handler",
        "resume_handler",
        "drain_request",
        "drain_lift",
        "drain_names_ok",
    ),
    # Trigger functions named after the channel they notify.
    "trigger functions named after their channel": ("notify_finished", "notify_wake"),
    # Retention started procrastinate-style at _v1, before the rule.
    "retention, versioned from _v1 (procrastinate style)": (
        "prune_finished_v1",
        "prune_finished_v2",
    ),
    # entity_verb, but started at _v1 before the rule.
    "entity_verb, but started at _v1": ("job_get_v1", "job_log_write_v1", "attempt_account_v1"),
    # A predicate on a registry row, inlined by PostgreSQL: the registry says daemon.
    "a predicate on a workers row, named for what a row is": ("daemon_silent",),
    # Schemas 24 and 25 (issues 22, 23) were written beside the rule, not after it:
    # functions that take over a statement of the same name carry _v2 (_v1 for one whose
    # statement had no number), and helpers are named for their area. Rename them at
    # their next version.
    "schema 24, written beside the rule: successors of statements": (
        "worker_register_v2",
        "worker_heartbeat_v2",
        "worker_deregister_v2",
        "worker_schedules_set_v2",
        "worker_mark_stale_v2",
        "job_lease_state_v1",
    ),
    # Successors (issue 24) of functions named before the rule: the unversioned name is
    # the callers' contract, so its successors keep it.
    "successors of names from before the rule": (
        "claim_jobs_v2",
        "claim_jobs_v3",
        "claim_v4",
        "enqueue_many_v3",
        "enqueue_v3",
        "enqueue_v4",  # schema 34 (issue 25): enqueue_v3 with dedupe windows and policies
    ),
    "schemas 24-25, written beside the rule: helpers named for their area": (
        "cron_field_matches",
        "cron_wall_matches",
        "cron_matches",
        "lease_token_draw",
        "fenced_refuse",
        "fenced_job_problem",
        "fenced_batch_problem",
    ),
}
EXCEPTIONS = {name for names in NAMED_BEFORE_THE_RULE.values() for name in names}
# Versioned after a statement of queries/, not after a function: no predecessor to find.
SUCCEED_STATEMENTS = set(
    NAMED_BEFORE_THE_RULE["schema 24, written beside the rule: successors of statements"]
)

# A statement's entity (the start of its name) -> the file of sql/queries/ it lives in.
STATEMENT_FILES = {
    "job_log": "job_logs",
    "job": "jobs",
    "worker": "workers",
    "schedule": "schedules",
    "attempt": "attempts",
    "signal": "signals",
    "batch": "batches",
    "paused": "paused",
    "handler_default": "handler_defaults",
    "view": "views",
    "schema": "schema",
    "session": "session",
    "wake": "session",
    "role": "session",
}


def declared() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(OBJECTS.glob("*.sql"))}


def functions() -> dict[str, str]:
    """Every function of the declared schema -> the file it is declared in."""
    found: dict[str, str] = {}
    for file, text in declared().items():
        for name in _FUNCTION_RE.findall(text):
            assert name not in found, f"{name} is declared in {found[name]} and in {file}"
            found[name] = file
    return found


def tables() -> list[str]:
    return [name for text in declared().values() for name in _TABLE_RE.findall(text)]


def entities() -> set[str]:
    """What a name may start with: each table's name, and its singular ("batches":
    "batch")."""
    names = set(tables())
    return (
        names
        | {name.removesuffix("s") for name in names}
        | {name.removesuffix("es") for name in names if name.endswith(("ches", "shes", "xes"))}
    )


def migrations_text() -> str:
    return "\n".join(path.read_text() for path in sorted(MIGRATIONS.glob("*.sql")))


def test_the_declaration_is_every_file_in_order() -> None:
    assert sorted(declared()) == sorted(migrate.DECLARATION)
    assert [name for name, _ in migrate.declaration()] == list(migrate.DECLARATION)


def test_each_table_is_declared_once_with_all_its_columns() -> None:
    names = tables()
    assert len(names) == len(set(names))
    assert {"jobs", "workers", "attempts", "job_logs", "schedules"} <= set(names)
    for file, text in declared().items():
        # a column added later belongs in the CREATE TABLE, not in an ALTER TABLE
        assert not re.search(r"^ALTER TABLE", text, re.MULTILINE), file


def test_functions_are_entity_verb() -> None:
    known = entities()
    offenders = []
    for name in functions():
        if name in EXCEPTIONS:
            continue
        base = _VERSION_RE.sub(r"\1", name)
        if not any(base.startswith(f"{entity}_") for entity in known):
            offenders.append(name)
    assert offenders == [], (
        f"functions not named entity_verb (an entity is a table: {sorted(known)}): "
        "see docs/development/sql.md"
    )


def test_the_rule_recognises_a_stray_name() -> None:
    known = entities()
    assert any("job_get".startswith(f"{e}_") for e in known)
    assert not any("fetch_job".startswith(f"{e}_") for e in known)


def test_every_listed_exception_still_exists() -> None:
    assert sorted(EXCEPTIONS - set(functions())) == []


@pytest.mark.parametrize("name", sorted(functions()))
def test_a_versioned_function_has_a_predecessor(name: str) -> None:
    match = _VERSION_RE.match(name)
    if not match:
        return
    base, version = match[1], int(match[2])
    if version == 1 or name in SUCCEED_STATEMENTS:
        assert name in EXCEPTIONS, f"{name}: a first version has no _v{version} suffix"
        return
    # the version before: _v(N-1), or for _v2 the unsuffixed name (or a listed _v1)
    predecessors = [f"{base}_v{version - 1}"] + ([base] if version == 2 else [])
    created = re.search(
        rf"^CREATE (?:OR REPLACE )?FUNCTION @schema@\.({'|'.join(predecessors)})\(",
        migrations_text(),
        re.MULTILINE,
    )
    assert created, f"{name}: _v{version} without a {' or '.join(predecessors)} before it"


def test_no_new_function_starts_at_v1() -> None:
    first_versions = [n for n in functions() if n.endswith("_v1") and n not in EXCEPTIONS]
    assert first_versions == []


def test_indexes_and_triggers_start_with_their_table() -> None:
    text = "\n".join(declared().values())
    indexes = _INDEX_RE.findall(text)
    triggers = _TRIGGER_RE.findall(text)
    assert len(indexes) >= 15 and len(triggers) >= 8
    bad = [
        name
        for name, table in indexes
        if not (name.startswith(f"{table}_") and name.endswith("_idx"))
    ]
    bad += [name for name, table in triggers if not name.startswith(f"{table}_")]
    assert bad == []


def test_named_constraints_start_with_their_table() -> None:
    bad = []
    for text in declared().values():
        for match in re.finditer(r"^CREATE TABLE @schema@\.(\w+) \((.*?)^\);", text, re.M | re.S):
            table, body = match[1], match[2]
            bad += [
                name
                for name in re.findall(r"CONSTRAINT (\w+)", body)
                if not name.startswith(f"{table}_")
            ]
    assert bad == []


def test_every_compatibility_object_names_who_needs_it_and_what_drops_it() -> None:
    lines = declared()["compat"].splitlines()
    named = 0
    for at, line in enumerate(lines):
        match = _FUNCTION_RE.match(line)
        if not match:
            continue
        named += 1
        above = []  # the comment right above the CREATE
        for previous in reversed(lines[:at]):
            if not previous.startswith("--"):
                break
            above.append(previous)
        assert any(ln.startswith("-- Needed by: ") for ln in above), match[1]
        assert any(ln.startswith("-- Dropped by: ") for ln in above), match[1]
    assert named == len([f for f in functions().values() if f == "compat"]) > 0


def test_no_function_is_compat_and_current_at_once() -> None:
    found = functions()
    compat = {name for name, file in found.items() if file == "compat"}
    assert {"claim", "claim_v2"} <= compat
    assert "claim_jobs" not in compat and "claim_v3" not in compat


# -- statements ----------------------------------------------------------------------------


def statement_files() -> dict[str, list[str]]:
    return {
        path.stem: re.findall(r"^-- name: (\w+)", path.read_text(), re.MULTILINE)
        for path in sorted(STATEMENTS.glob("*.sql"))
    }


def entity_file(name: str) -> str | None:
    for entity in sorted(STATEMENT_FILES, key=len, reverse=True):
        if name.startswith(f"{entity}_"):
            return STATEMENT_FILES[entity]
    return None


def test_every_statement_name_is_defined_exactly_once() -> None:
    every = [name for names in statement_files().values() for name in names]
    assert len(every) > 80
    duplicates = sorted({name for name in every if every.count(name) > 1})
    assert duplicates == []
    assert sorted(queries._raw()) == sorted(every)


def test_each_statement_lives_in_the_file_of_its_entity() -> None:
    misplaced = [
        f"{name} in {file}.sql"
        for file, names in statement_files().items()
        for name in names
        if entity_file(name) != file
    ]
    assert misplaced == []


def test_the_registry_refuses_a_name_defined_twice() -> None:
    one = "-- name: job_get\n-- One job.\nSELECT 1;\n"
    other = "-- name: job_list\n-- Jobs.\nSELECT 2;\n"
    assert queries._registry([("a.sql", one), ("b.sql", other)]) == {
        "job_get": "SELECT 1",
        "job_list": "SELECT 2",
    }
    with pytest.raises(
        ValueError, match=re.escape("'job_get' is defined in a.sql and again in b.sql")
    ):
        queries._registry([("a.sql", one), ("b.sql", one)])
    with pytest.raises(
        ValueError, match=re.escape("'job_get' is defined in a.sql and again in a.sql")
    ):
        queries._registry([("a.sql", one + one)])


# -- the contributor docs' map -------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "development" / "sql.md"


def test_the_docs_map_names_every_table_and_function_in_its_file() -> None:
    """docs/development/sql.md's "Where is X defined": each declared table and function
    appears, as `name`, on the row of the file that declares it."""
    text = DOCS.read_text()
    section = text[text.index("### Tables and their functions") : text.index("### Statements")]
    rows = {match[1]: match[0] for match in re.finditer(r"^\| `(\w+)\.sql` \|.*$", section, re.M)}
    assert sorted(rows) == sorted(migrate.DECLARATION)
    missing = []
    for file, text in declared().items():
        for name in _FUNCTION_RE.findall(text) + _TABLE_RE.findall(text):
            if f"`{name}`" not in rows[file]:
                missing.append(f"{name} ({file}.sql)")
    assert missing == []


@pytest.mark.parametrize(
    "text",
    ["'expired: not started by its expires_at '", "'expired: its lease ran out after its"],
)
def test_ending_an_expired_job_is_written_once(text: str) -> None:
    """job_expired_cancel is the one text of that transition: the claims call it (0039)
    instead of restating its UPDATEs, so a fix to one cannot miss the others."""
    found = [file for file, body in declared().items() for _ in range(body.count(text))]
    assert found == ["retention"]
