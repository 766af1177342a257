"""Regenerate the dashboard's pictures in the docs (docs/images/dashboard/*.png, shown by
docs/operations/dashboard.md): runs tests/web/test_console_screenshots.py (a real daemon,
a real dashboard, headless Chromium) with DOCS_SCREENSHOTS set.

    .venv/bin/python tests/support/dashboard_screenshots.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    env = {**os.environ, "DOCS_SCREENSHOTS": "1"}
    test = "tests/web/test_console_screenshots.py"
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", test]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
