"""The dashboard under test: a real `pgworkerd web` server (waitress, in a thread of the
test process) on the test's schema, and a real headless Chromium driving it.

Chromium and chromedriver are Debian's (deploy/bootstrap installs them); selenium talks
to that chromedriver, so nothing downloads a browser. Screenshots go to ARTIFACTS
(gitignored), one per page, kept after the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pgworkerd.config import WebConfig
from pgworkerd.web.passwords import hash_password
from pgworkerd.web.server import Dashboard, build

USER = "operator"
PASSWORD = "correct horse battery staple"
PASSWORD_HASH = hash_password(PASSWORD)

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "web"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class RunningDashboard:
    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.url = dashboard.url.rstrip("/")
        self.thread = threading.Thread(target=dashboard.run, name="dashboard", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.dashboard.close()
        self.thread.join(timeout=10)


@pytest.fixture
def start_dashboard(test_db_dsn: str, schema: str) -> Iterator[Callable[..., RunningDashboard]]:
    """start_dashboard(**web_settings): a served dashboard; users default to USER."""
    started: list[RunningDashboard] = []

    def start(**settings: Any) -> RunningDashboard:
        settings.setdefault("users", {USER: PASSWORD_HASH})
        web = WebConfig(port=0, **settings)
        running = RunningDashboard(build(web, test_db_dsn, schema))
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            running.close()


@pytest.fixture
def dashboard(start_dashboard: Callable[..., RunningDashboard]) -> RunningDashboard:
    return start_dashboard()
