"""The package's layering, checked on its imports (docs/development/layout.md says the same).

Static: every `import` in pgworkerd/ (module level, inside functions, under TYPE_CHECKING)
is read with `ast` and sorted into the part of the package it belongs to:

  client      pgworkerd/client.py   the application API: JobSpec, enqueue, enqueue_many
              pgworkerd/signals.py  and signal (durable waits)
              pgworkerd/batches.py  and batch, batch_members (batches)
              pgworkerd/aio.py      and the same on psycopg's AsyncConnection
  worker      pgworkerd/worker/     the child side: JobContext, the child, the fork server
  queue       pgworkerd/queue/      the SQL core
  daemon      pgworkerd/daemon/     the parent's components
  cli         pgworkerd/cli/        the click commands
  ops         pgworkerd/ops/        systemd, metrics, logs
  devcluster  pgworkerd/devcluster/ throwaway PostgreSQL clusters, the demo
  web         pgworkerd/web/        the dashboard (`pgworkerd web`)
  config      pgworkerd/config/     the TOML configuration (a shared part, with its own rules)
  contrib     pgworkerd/contrib/    enqueue on Django's or SQLAlchemy's own connection
  shared      pgworkerd/*.py        dependency-free modules (config, model, durations, ...)
  face        pgworkerd/__init__.py the package face (lazy: imports on first attribute use)

Runtime: importing the child side, the package face or the config in a fresh interpreter
loads no psycopg (a static graph cannot see what the package face pulls in).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "pgworkerd"
SUBPACKAGES = ("worker", "queue", "daemon", "cli", "ops", "devcluster", "web", "config", "contrib")

# part -> the parts (and "psycopg") it must never import.
FORBIDDEN: dict[str, set[str]] = {
    "worker": {"client", "queue", "daemon", "cli", "ops", "devcluster", "psycopg", "web"},
    "shared": {"client", "queue", "daemon", "cli", "ops", "devcluster", "psycopg"},
    # the config is shared too: every part may read it, it reads none of them (but the
    # dashboard's password hashes, to check [web.users])
    "config": {"client", "queue", "daemon", "cli", "ops", "devcluster", "worker", "psycopg"},
    "client": {"daemon", "cli", "ops", "worker", "devcluster", "web"},
    "queue": {"client", "daemon", "cli", "ops", "worker", "devcluster", "web"},
    # ops reads the job statuses from the dependency-free pgworkerd.model
    "ops": {"client", "queue", "daemon", "cli", "devcluster"},
    # Nothing outside cli and devcluster imports devcluster; nothing imports cli.
    "daemon": {"client", "cli", "devcluster", "web"},
    # the dashboard reads through queue (views, explain, joblogs) and acts through the
    # functions the CLI uses (queue's admin and fleet; the application API for an enqueue
    # and a signal, as `pgworkerd enqueue` and `signal`); only cli imports it (and config
    # its password hashes)
    "web": {"daemon", "cli", "worker", "devcluster"},
    "devcluster": {"cli"},
    "face": {"daemon", "cli", "ops", "devcluster", "worker"},
    # framework helpers: the application API on the framework's connection, nothing else
    "contrib": {"queue", "daemon", "cli", "ops", "worker", "devcluster", "web"},
}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted module name imported
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def imports_of(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> Iterator[Import]:
    """Every module `tree` (code of `module`) imports, wherever the statement is.

    `from X import Y` imports X, and X.Y too when that is a module of `known`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield Import(module, target, node.lineno)
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    yield Import(module, f"{target}.{alias.name}", node.lineno)


def part_of(module: str) -> str | None:
    """The part of the package `module` belongs to; "psycopg" for psycopg; None for the
    standard library and other distributions."""
    parts = module.split(".")
    if parts[0] == "psycopg" or parts[0].startswith("psycopg_"):
        return "psycopg"
    if parts[0] != "pgworkerd":
        return None
    if len(parts) == 1:
        return "face"
    if parts[1] in ("client", "signals", "batches", "aio"):
        return "client"
    return parts[1] if parts[1] in SUBPACKAGES else "shared"


def package_imports() -> list[Import]:
    modules = package_modules()
    known = set(modules)
    found: list[Import] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found.extend(imports_of(tree, name, path.name == "__init__.py", known))
    return found


def violations(importer_part: str) -> list[str]:
    return [
        str(imp)
        for imp in package_imports()
        if part_of(imp.importer) == importer_part
        and part_of(imp.target) in FORBIDDEN[importer_part]
    ]


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_imports_go_only_in_the_allowed_directions(part: str) -> None:
    found = violations(part)
    assert not found, f"{part} must not import {sorted(FORBIDDEN[part])}:\n" + "\n".join(found)


def test_only_cli_and_devcluster_import_devcluster_and_nothing_imports_cli() -> None:
    found = [
        str(imp)
        for imp in package_imports()
        if (
            part_of(imp.target) == "devcluster"
            and part_of(imp.importer) not in ("cli", "devcluster")
        )
        or (part_of(imp.target) == "cli" and part_of(imp.importer) != "cli")
    ]
    assert not found, "\n".join(found)


def test_every_subpackage_has_rules() -> None:
    # A new subpackage would otherwise count as "shared" and meet the wrong rules.
    found = {p.parent.name for p in PACKAGE_DIR.glob("*/__init__.py")}
    assert found == set(SUBPACKAGES)


def test_the_walk_sees_lazy_relative_and_type_checking_imports() -> None:
    # The rules above are only as good as this walk: a statement it missed would pass them.
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import psycopg.rows\n"
        "from . import wire\n"
        "from ..queue import lease\n"
        "if TYPE_CHECKING:\n"
        "    from pgworkerd.daemon.loop import Timers\n"
        "def later():\n"
        "    from pgworkerd.ops import logs\n"
        "    import pgworkerd.cli\n"
    )
    known = {"pgworkerd.worker.wire", "pgworkerd.queue.lease", "pgworkerd.ops.logs"}
    tree = ast.parse(source)
    targets = {i.target for i in imports_of(tree, "pgworkerd.worker.child", False, known)}
    assert {
        "psycopg.rows",
        "pgworkerd.worker",
        "pgworkerd.worker.wire",
        "pgworkerd.queue",
        "pgworkerd.queue.lease",
        "pgworkerd.daemon.loop",
        "pgworkerd.ops",
        "pgworkerd.ops.logs",
        "pgworkerd.cli",
    } <= targets
    # ... and on the real package it finds edges everyone knows are there.
    edges = {(i.importer, i.target) for i in package_imports()}
    assert ("pgworkerd.devcluster.demo", "pgworkerd.daemon.loop") in edges
    assert ("pgworkerd.worker.forkserver", "pgworkerd.worker.child") in edges
    assert ("pgworkerd.queue.lease", "psycopg") in edges
    assert ("pgworkerd.client", "pgworkerd.queue.queries") in edges


@pytest.mark.parametrize(
    "module",
    [
        "pgworkerd",
        "pgworkerd.worker",
        "pgworkerd.worker.forkserver",
        "pgworkerd.child",  # the handler import path of JobContext
        "pgworkerd.examples",  # the example handlers, as config files name them
        "pgworkerd.config",
        "pgworkerd.earlytitle",
        "pgworkerd.model",
        "pgworkerd.ops.metrics",  # the endpoint needs the statuses, not the SQL core
    ],
)
def test_importing_leaves_psycopg_and_the_queue_unloaded(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "print(' '.join(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] == 'psycopg' or m.startswith('pgworkerd.queue'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = result.stdout.split()
    assert not loaded, f"import {module} loads {', '.join(loaded[:10])}"


def test_no_part_takes_a_name_from_the_package_face() -> None:
    """The face re-exports for applications; inside the package every name comes from the
    module that defines it (`__version__` from pgworkerd.version), so no part depends on
    what the face loads. `from pgworkerd import <module>` imports that module, not a name."""
    modules = package_modules()
    taken = []
    for name, path in modules.items():
        if name == "pgworkerd":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "pgworkerd":
                taken += [
                    f"{name}:{node.lineno} takes {alias.name} from the face"
                    for alias in node.names
                    if f"pgworkerd.{alias.name}" not in modules
                ]
    assert not taken


def test_the_package_face_names_the_application_api() -> None:
    """What the README's Python examples import from `pgworkerd` itself."""
    import pgworkerd
    from pgworkerd import batches, client, signals
    from pgworkerd.worker import outcomes

    # what handlers raise (issues 11, 24) or return (Done with follow-ups, issue 24)
    child_side = {"Done", "GiveUp", "Snooze", "WaitFor"}
    signalling = {"SignalRefused", "SignalSent", "signal"}  # durable waits (issue 24)
    batching = {"BatchIds", "batch", "batch_members"}  # batches (issue 24)
    for name in pgworkerd.__all__:
        if name != "__version__":
            home = outcomes if name in child_side else signals if name in signalling else client
            home = batches if name in batching else home
            assert getattr(pgworkerd, name) is getattr(home, name), name
    assert set(pgworkerd.__all__) == {
        "InvalidJob",
        "JobSpec",
        "__version__",
        # dedupe_policy "reject" (issue 25)
        "DuplicateJob",
        "enqueue",
        "enqueue_many",
        "enqueue_typed",  # typed payloads (issue 26)
        # waiting for a job, and a handler's outcomes (issue 11)
        "JobFailed",
        "JobInfo",
        "JobNotFound",
        "WaitTimeout",
        "get",
        "wait",
        *child_side,
        *signalling,
        *batching,
    }


def test_a_handler_raising_through_the_package_face_loads_no_psycopg() -> None:
    code = (
        "import sys, pgworkerd\n"
        "pgworkerd.Snooze(1), pgworkerd.GiveUp('x'), pgworkerd.Done(1)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert not result.stdout.split(), result.stdout


def test_the_older_paths_are_one_line_re_exports_of_the_child_side() -> None:
    """pgworkerd.child (JobContext's older import path) and pgworkerd.examples (what config
    files name the example handlers by, e.g. `pgworkerd.examples:echo`) define nothing:
    one statement each, giving the very objects of pgworkerd.worker."""
    import pgworkerd.child
    import pgworkerd.examples
    import pgworkerd.worker
    import pgworkerd.worker.examples

    for shim, home in (
        (pgworkerd.child, pgworkerd.worker),
        (pgworkerd.examples, pgworkerd.worker.examples),
    ):
        body = ast.parse(Path(str(shim.__file__)).read_text(encoding="utf-8")).body
        statements = [
            s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        ]
        assert len(statements) == 1 and isinstance(statements[0], ast.ImportFrom), shim.__name__
        assert home.__all__
        for name in home.__all__:
            assert getattr(shim, name) is getattr(home, name), f"{shim.__name__}.{name}"


def test_the_version_is_declared_once() -> None:
    """pgworkerd/version.py is the one place: pyproject.toml takes it at build time
    (tests/acceptance/test_packaging.py checks the wheel's metadata), and the installed
    command prints it, from a checkout's editable install too."""
    import tomllib

    from pgworkerd.version import __version__

    with (PACKAGE_DIR.parent / "pyproject.toml").open("rb") as f:
        pyproject = tomllib.load(f)
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "pgworkerd.version.__version__"}
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("pgworkerd")), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (shown.returncode, shown.stdout) == (0, f"pgworkerd, version {__version__}\n")
