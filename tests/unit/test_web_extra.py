"""`pgworkerd web` without the [web] extra: a daemon-only install has none of Flask,
waitress and psycopg-pool (pyproject.toml), so the command names what is missing and how
to install it, and changes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pgworkerd.exitcodes import ExitCode


@pytest.mark.parametrize("module", ["flask", "waitress", "psycopg_pool"])
def test_the_dashboard_without_its_extra_says_what_to_install(module: str) -> None:
    # None in sys.modules: importlib finds no such module, as when it is not installed
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"
        "from pgworkerd.cli import main\n"
        "sys.argv = ['pgworkerd', 'web']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.CONFIG, done.stderr
    assert f"({module} not installed)" in done.stderr
    assert "pip install 'pgworkerd[web]'" in done.stderr
    assert "Traceback" not in done.stderr
