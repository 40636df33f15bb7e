"""Fixtures of the dashboard tests: a seeded broker (memory, SQLite, PostgreSQL, Redis), the app
served by uvicorn on a loopback port in a background thread, and headless Chromium.

The browser is Debian's ``chromium`` driven through its ``chromedriver`` (selenium, told both
paths, so nothing is downloaded). Without them the browser tests skip locally and FAIL in CI
(``CI`` set), as a missing server does.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.sql import SQLBroker

from .seed import Seeded, seed

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"


@pytest.fixture(params=["memory", "sqlite", "postgresql", "redis"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """A broker of each backend the dashboard tests run on (a fresh database or key prefix)."""
    if request.param == "memory":
        made: Broker = MemoryBroker()
    elif request.param == "sqlite":
        made = SQLBroker(f"sqlite:///{tmp_path / 'dash.db'}")
    elif request.param == "redis":
        made = _redis_broker(request)
    else:
        made = SQLBroker(request.getfixturevalue("postgresql_url"))
    yield made
    made.close()


def _redis_broker(request: pytest.FixtureRequest) -> Broker:
    from helpers.redis_servers import purge_prefix

    from taskgate.brokers.redis import RedisBroker

    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("unique_prefix")

    request.addfinalizer(functools.partial(purge_prefix, url, prefix))
    return RedisBroker(url, key_prefix=prefix)


@pytest.fixture
def seeded(broker: Broker) -> Seeded:
    """The broker's seeded task ids (`seed.seed`)."""
    return seed(broker)


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 in a daemon thread, at ``url``."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("uvicorn did not start within 30 s")

    def _run(self) -> None:
        original = self._server.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets=sockets)
            self._ready.set()

        self._server.startup = startup  # type: ignore[method-assign]
        self._server.run(sockets=[self._sock])

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Any], Served]]:
    """``serve(app)`` starts serving ``app`` for the test; stopped after it."""
    started: list[Served] = []

    def start(app: Any) -> Served:
        served = Served(app)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def _require_browser() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if not missing:
        return
    message = f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run the browser tests", pytrace=False)
    pytest.skip(message)


def _chromium(*, javascript: bool) -> Any:
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(flag)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium, through the system chromedriver."""
    driver = _chromium(javascript=True)
    yield driver
    driver.quit()


@pytest.fixture
def browser_without_js() -> Iterator[Any]:
    """Headless Chromium with JavaScript switched off."""
    driver = _chromium(javascript=False)
    yield driver
    driver.quit()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    """``shots(driver, name)`` saves a screenshot under ``test-artifacts/dashboard/``."""

    def save(driver: Any, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        driver.save_screenshot(str(path))
        return path

    return save
