"""Helpers for the dashboard tests (tests/web): a served dashboard in a thread, a plain
HTTP client that keeps its session cookie, and what the browser tests do often.

The browser is Debian's headless Chromium through Debian's chromedriver (the same
version, both installed by deploy/bootstrap --test, which tests/run calls); selenium
drives it, and nothing downloads a browser. Screenshots go to ARTIFACTS (gitignored)
and stay after the run.
"""

from __future__ import annotations

import http.client
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgworkerd.web.passwords import hash_password
from pgworkerd.web.server import Dashboard

USER = "operator"
PASSWORD = "correct horse battery staple"
PASSWORD_HASH = hash_password(PASSWORD)

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "web"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)
# Generous: a loaded 2-core machine, a browser and a daemon.
BROWSER_DEADLINE = 30.0


class RunningDashboard:
    """A built dashboard served by a thread of the test process."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.url = dashboard.url.rstrip("/")
        self.port = int(dashboard.server.effective_port)
        self.thread = threading.Thread(target=dashboard.run, name="dashboard", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.dashboard.close()
        self.thread.join(timeout=10)


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: str

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.body)
        assert found, f"no CSRF token in:\n{self.body[:2000]}"
        return found[1]


@dataclass
class Http:
    """A plain HTTP client for one dashboard: follows no redirect, keeps the session
    cookie it is given."""

    port: int
    host: str = "127.0.0.1"
    cookie: str = ""  # "name=value; name=value", as a Cookie header
    extra_headers: dict[str, str] = field(default_factory=dict)
    source: str = ""  # the client's address (any 127.x.y.z): "" lets the kernel choose

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection(
            "127.0.0.1",
            self.port,
            timeout=BROWSER_DEADLINE,
            source_address=(self.source, 0) if self.source else None,
        )
        sent = {"Host": f"{self.host}:{self.port}", **self.extra_headers, **(headers or {})}
        if self.cookie:
            sent["Cookie"] = self.cookie
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            reply = Reply(response.status, response.headers, response.read().decode())
        finally:
            conn.close()
        # every cookie set (the session's, the device token's), as a browser keeps them
        jar = dict(part.split("=", 1) for part in self.cookie.split("; ") if "=" in part)
        for set_cookie in reply.headers.get_all("Set-Cookie") or []:
            name, _, value = set_cookie.split(";", 1)[0].partition("=")
            if value:
                jar[name] = value
            else:  # an expired (deleted) cookie
                jar.pop(name, None)
        self.cookie = "; ".join(f"{name}={value}" for name, value in jar.items())
        return reply

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, form: dict[str, str], **kw: Any) -> Reply:
        return self.request("POST", path, form=form, **kw)

    def log_in(self, user: str = USER, password: str = PASSWORD) -> Reply:
        token = self.get("/login").csrf()
        return self.post("/login", {"csrf": token, "user": user, "password": password})


def screenshot(driver: Any, name: str) -> Path:
    """Keep a screenshot of the current page as ARTIFACTS/NAME.png (path printed)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def wait_browser(
    driver: Any, condition: Callable[[Any], Any], what: str, timeout: float = BROWSER_DEADLINE
) -> Any:
    """Wait until condition(driver) is truthy; returns its value."""
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, message=f"timed out after {timeout}s waiting for {what}"
    )


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def text_of(driver: Any, element_id: str) -> str:
    """The element's text, or "" while it is not on the page. A live refresh may replace
    the element between finding and reading it: then it is found again."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(20):
        found = driver.find_elements(By.ID, element_id)
        try:
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"#{element_id} kept being replaced while read")


@contextmanager
def chromium(profile: Path, *flags: str) -> Iterator[Any]:
    """A fresh headless Chromium with its own profile (and `flags` beside CHROMIUM_FLAGS),
    its chromedriver's log beside the profile; quit at the end. The one place the tests
    start a browser (tests/web/conftest.py's `browser` fixture)."""
    import pytest
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(
            "no Chromium: tests/run (deploy/bootstrap --test) installs it"
            " (apt chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags):
        options.add_argument(flag)
    service = Service(CHROMEDRIVER, log_output=str(profile.with_name("chromedriver.log")))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()


def log_in(driver: Any, running: RunningDashboard, path: str = "/login") -> None:
    """Log in as USER through the login form at `path` (a `next=` in it is followed), and
    wait for the overview."""
    driver.get(running.url + path)
    by_id(driver, "user").send_keys(USER)
    by_id(driver, "password").send_keys(PASSWORD)
    by_id(driver, "login").click()
    wait_browser(driver, lambda d: text_of(d, "daemons"), "the overview after login")


def confirm(driver: Any, link_id: str) -> None:
    """Click an action's link, then the confirmation page's button."""
    by_id(driver, link_id).click()
    wait_browser(driver, lambda d: text_of(d, "confirm"), "the confirmation page")
    by_id(driver, "confirm").click()
    wait_browser(driver, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
