# ruff: noqa: B023 (each lambda is called at once, inside the iteration that made it)
"""What schema 34 (dedupe windows and policies) costs an enqueue with a dedupe key: the
same calls against a schema migrated up to 0033 (before) and a current one (after), and
what the new keys cost beside them.

    .venv/bin/python bench/dedupe_bench.py [--short]

A private LocalPostgres, two schemas side by side, each call inside one SELECT (the
server's cost alone: the look-up and release of a lapsed window, the wider unique index):

- a new key per job (`enqueue(..., dedupe_key)`: an insert);
- one key held by a pending job (every call a hit: returns its id);
- enqueue_many of 2,000 jobs with new keys;
- enqueue_many_v3 of 2,000 jobs with new keys;
- after only: enqueue_many_v3 of 2,000 jobs with new keys and a dedupe_window; debounce
  hits on one pending job through enqueue_v4 (each moves its run_at), 200 calls each in
  its own transaction.

The variants alternate, rotating their order, so that the load of a shared machine falls
on all alike; medians of the rounds are printed. A benchmark, not a test: nothing is
asserted.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import _measure  # bench/_measure.py (bench/ is on sys.path)
import psycopg
from psycopg import sql

from pgworkerd.queue.migrate import migrate, migrations
from pgworkerd.queue.queries import render

BEFORE, AFTER = "before_0034", "after_0034"
N = 2_000
NEW_KEYS = (
    "SELECT count(@schema@.enqueue('noop', dedupe_key => %s || g)) FROM generate_series(1, {n}) g"
)
HITS = "SELECT count(@schema@.enqueue('noop', dedupe_key => 'held')) FROM generate_series(1, {n})"
MANY = "SELECT cardinality(@schema@.enqueue_many(%s::jsonb))"
MANY_V3 = "SELECT cardinality(@schema@.enqueue_many_v3(%s::jsonb))"
# one statement (and transaction) per call: each hit writes a new version of the one row
DEBOUNCE = (
    "SELECT @schema@.enqueue_v4('noop', dedupe_key => 'debounced', dedupe_policy =>"
    " 'debounce', debounce => '1 hour', debounce_max => '1 day')"
)
DEBOUNCE_CALLS = 200
# the same, as a plain hit through enqueue_v3 (both schemas): what a call costs anyway
V3_HIT = "SELECT @schema@.enqueue_v3('noop', dedupe_key => 'held')"


def migrate_before(admin: psycopg.Connection, schema: str) -> None:
    """The schema as it was before 0034: every earlier migration, applied as migrate does."""
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for migration in migrations():
        if migration.version < 34:
            admin.execute(render(migration.sql, schema))


def rate(count: int, work: Callable[[], Any]) -> float:
    start = time.perf_counter()
    work()
    return count / (time.perf_counter() - start)


def main() -> None:
    args = _measure.arguments(__doc__, json_output=False).parse_args()
    rounds = 4 if args.short else 20
    with _measure.server(settings={}) as (owner, _):
        migrate(owner, AFTER)
        results: dict[str, dict[str, list[float]]] = {}
        with psycopg.connect(owner, autocommit=True) as c:
            migrate_before(c, BEFORE)
            for schema in (BEFORE, AFTER):
                c.execute(render("SELECT @schema@.enqueue('noop', dedupe_key => 'held')", schema))
            for n in range(rounds):
                for schema in (BEFORE, AFTER) if n % 2 == 0 else (AFTER, BEFORE):
                    fig = results.setdefault(schema, {})
                    prefix = f"r{n}:"
                    fig.setdefault("new key per job", []).append(
                        rate(N, lambda: c.execute(render(NEW_KEYS.format(n=N), schema), [prefix]))
                    )
                    fig.setdefault("hit on a held key", []).append(
                        rate(N, lambda: c.execute(render(HITS.format(n=N), schema)))
                    )
                    jobs = json.dumps(
                        [{"handler": "noop", "dedupe_key": f"m{n}:{i}"} for i in range(N)]
                    )
                    fig.setdefault(f"enqueue_many {N:,} new keys", []).append(
                        rate(N, lambda: c.execute(render(MANY, schema), [jobs]))
                    )
                    fig.setdefault(f"enqueue_many_v3 {N:,} new keys", []).append(
                        rate(
                            N,
                            lambda: c.execute(render(MANY_V3, schema), [jobs.replace('"m', '"v')]),
                        )
                    )
                    fig.setdefault("enqueue_v3 hit (autocommit)", []).append(
                        rate(
                            DEBOUNCE_CALLS,
                            lambda: [
                                c.execute(render(V3_HIT, schema)) for _ in range(DEBOUNCE_CALLS)
                            ],
                        )
                    )
                    if schema == AFTER:
                        windowed = json.dumps(
                            [
                                {
                                    "handler": "noop",
                                    "dedupe_key": f"w{n}:{i}",
                                    "dedupe_window": 3600,
                                }
                                for i in range(N)
                            ]
                        )
                        fig.setdefault(f"enqueue_many_v3 {N:,} with a window", []).append(
                            rate(N, lambda: c.execute(render(MANY_V3, schema), [windowed]))
                        )
                        fig.setdefault("debounce hit (enqueue_v4, autocommit)", []).append(
                            rate(
                                DEBOUNCE_CALLS,
                                lambda: [
                                    c.execute(render(DEBOUNCE, schema))
                                    for _ in range(DEBOUNCE_CALLS)
                                ],
                            )
                        )
                # keep the table from growing into the figures: the rounds' new jobs go
                for schema in (BEFORE, AFTER):
                    c.execute(
                        render(
                            "DELETE FROM @schema@.jobs WHERE dedupe_key NOT IN "
                            "('held', 'debounced')",
                            schema,
                        )
                    )
                    # and their dead rows: the after schema gets more writes (windows,
                    # debounces), which must not weigh on its next round's figures
                    c.execute(render("VACUUM ANALYZE @schema@.jobs", schema))
    _measure.headline(
        "dedupe windows",
        args.short,
        f"{rounds} alternating rounds of {N:,} calls in one SELECT, medians, jobs/s",
    )
    for label in results[AFTER]:
        after = statistics.median(results[AFTER][label])
        if label in results[BEFORE]:
            before = statistics.median(results[BEFORE][label])
            print(
                f"  {label:36} before {before:9,.0f}   after {after:9,.0f} ({after / before:.3f})"
            )
        else:
            print(f"  {label:36}                    after {after:9,.0f}")


if __name__ == "__main__":
    main()
