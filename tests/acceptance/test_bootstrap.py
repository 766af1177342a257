"""deploy/bootstrap in its two sizes: the demo's (PostgreSQL's server, the .venv, the
package with [binary,web]) and the test suite's (`--test`: PgBouncer, Chromium and its
driver, the [test] extras), both idempotent. The plan is read through its dry run
(BOOTSTRAP_DRY_RUN=1: what it checks and would do); the demo's install runs for real in
a fresh copy of the project, with a fresh .venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "deploy" / "bootstrap"


def dry_run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cwd / "deploy" / "bootstrap"), *args],
        env={**os.environ, "BOOTSTRAP_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def copy_project(to: Path) -> Path:
    """What a clone has that the install reads: the package, its metadata, deploy/."""
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "config.example.toml"):
        shutil.copy2(REPO / name, to / name)
    for tree in ("pgworkerd", "deploy", "systemd"):
        shutil.copytree(
            REPO / tree, to / tree, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    return to


def test_the_demo_size_needs_no_pgbouncer_chromium_or_test_toolchain(tmp_path: Path) -> None:
    project = copy_project(tmp_path)  # no .venv yet
    demo = dry_run(cwd=project)
    assert demo.returncode == 0, demo.stderr
    assert "needs postgresql" in demo.stderr or "installing postgresql" in demo.stderr
    for absent in ("pgbouncer", "chromium", "[test]"):
        assert absent not in demo.stderr, demo.stderr
    assert "pip install -e '.[binary,web]'" in demo.stderr, demo.stderr

    tests = dry_run("--test", cwd=project)
    assert tests.returncode == 0, tests.stderr
    for needed in ("postgresql", "pgbouncer", "chromium", "chromium-driver"):
        assert f"needs {needed}:" in tests.stderr or f"installing {needed} " in tests.stderr
    assert "pip install -e '.[test,docs]'" in tests.stderr, tests.stderr


def test_a_wrong_argument_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    done = subprocess.run(
        [str(project / "deploy" / "bootstrap"), "--tests"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown argument: --tests" in done.stderr
    assert not (project / ".venv").exists()


@pytest.mark.slow
def test_the_demo_bootstrap_installs_the_demo_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    first = subprocess.run(
        [str(project / "deploy" / "bootstrap")], capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stderr
    python = project / ".venv" / "bin" / "python"
    # what the demo and its hints need: the package, psycopg's wheel, the dashboard
    probe = subprocess.run(
        [str(python), "-c", "import pgworkerd, psycopg, flask, waitress, psycopg_pool"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    assert (project / ".venv" / "bin" / "pgworkerd").exists()
    # and nothing of the test toolchain
    for tool in ("pytest", "mypy", "ruff"):
        assert not (project / ".venv" / "bin" / tool).exists(), tool
    selenium = subprocess.run([str(python), "-c", "import selenium"], capture_output=True)
    assert selenium.returncode != 0

    started = time.monotonic()
    again = subprocess.run(
        [str(project / "deploy" / "bootstrap")], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and again.stderr == "", again.stderr  # nothing to do
    assert time.monotonic() - started < 10
    # the suite's size still has its part to do
    assert "pip install -e '.[test,docs]'" in dry_run("--test", cwd=project).stderr
