"""Fixtures of the dashboard tests: a served dashboard on the test's schema and a fresh
headless Chromium (helpers: tests/support/dashboard_harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_harness import (
    CHROMEDRIVER,
    CHROMIUM,
    CHROMIUM_FLAGS,
    PASSWORD_HASH,
    USER,
    RunningDashboard,
)

from pgworkerd.config import WebConfig
from pgworkerd.web.server import build


@pytest.fixture
def start_dashboard(test_db_dsn: str, schema: str) -> Iterator[Callable[..., RunningDashboard]]:
    """start_dashboard(**web_settings) serves a dashboard on an ephemeral loopback port;
    [web.users] default to USER with PASSWORD."""
    started: list[RunningDashboard] = []

    def start(**settings: Any) -> RunningDashboard:
        settings.setdefault("users", {USER: PASSWORD_HASH})
        running = RunningDashboard(build(WebConfig(port=0, **settings), test_db_dsn, schema))
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


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A fresh headless Chromium with its own profile; quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(
            "no Chromium: tests/run (deploy/bootstrap --test) installs it"
            " (apt chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
