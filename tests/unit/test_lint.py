"""The code stays ruff-clean, ruff-formatted and mypy-clean (configured in pyproject.toml)."""

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run(
        [str(ruff), "check", "pgworkerd", "tests", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_formatted() -> None:
    """`ruff format` leaves every file as it is (after a merge: run it, then commit)."""
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run(
        [str(ruff), "format", "--check", "pgworkerd", "tests", "bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_clean() -> None:
    """The package, and the unit tier with its fakes: each fake is passed where the real
    component's Protocol is declared (e.g. claimer.ClaimStatements, children.
    ChildSupervisor), so a fake that drifts from what it stands for fails here."""
    with (REPO / "pyproject.toml").open("rb") as f:
        checked = tomllib.load(f)["tool"]["mypy"]["files"]
    assert {"pgworkerd", "tests/unit", "tests/support"} <= set(checked)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],  # the files and settings: [tool.mypy]
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
