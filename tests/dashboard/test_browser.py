"""The dashboard in a real browser: headless Chromium against the app served by uvicorn on
loopback, mounted under ``/ops/tasks`` of a host app (as in FastAPI), on SQLite. Each test
saves screenshots under ``test-artifacts/dashboard/``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait
from starlette.applications import Starlette
from starlette.routing import Mount

from taskgate import Status, dashboard
from taskgate.brokers.base import Broker
from taskgate.brokers.sql import SQLBroker

from .conftest import Served
from .seed import ATTACK, QUEUES, Seeded, busy

MOUNT = "/ops/tasks"


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    """One backend in the browser: SQLite (the others are covered by the HTTP-level tests)."""
    made = SQLBroker(f"sqlite:///{tmp_path / 'browser.db'}")
    yield made  # type: ignore[misc]
    made.close()


def _site(serve: Callable[[Any], Served], broker: Broker, **options: Any) -> str:
    host = Starlette(routes=[Mount(MOUNT, app=dashboard.app(broker, queues=QUEUES, **options))])
    return serve(host).url + MOUNT


def _wait(browser: Any) -> WebDriverWait:  # type: ignore[type-arg]
    return WebDriverWait(browser, 10)


def test_overview_shows_counts_by_type_and_status_and_the_queues_figures(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any, shots: Any
) -> None:
    browser.get(_site(serve, broker) + "/")
    counts = _wait(browser).until(ec.presence_of_element_located((By.ID, "counts")))
    shots(browser, "overview")
    rows = {
        row.find_elements(By.TAG_NAME, "td")[0].text: row.text
        for row in counts.find_elements(By.CSS_SELECTOR, "tbody tr")
    }
    assert set(rows) == {"retrieve", "generate", "score", "ocr", ATTACK}
    llm = browser.find_element(By.XPATH, "//table[@id='queues']//tr[td[1][normalize-space()='llm']]")
    cells = [td.text for td in llm.find_elements(By.TAG_NAME, "td")]
    assert cells[:6] == ["llm", "2", "3.0", "0", "1", "0"]  # workers, rps, running, backlog, unhandled
    assert cells[6:8] == ["1 / 100", "99"]  # quota used / limit, left
    assert cells[8].endswith("UTC")  # the window's end
    browser.set_window_size(390, 844)  # a phone
    shots(browser, "overview-phone")


def test_a_filtered_list_shows_only_the_matching_tasks(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any, shots: Any
) -> None:
    browser.get(_site(serve, broker) + "/tasks")
    Select(_wait(browser).until(ec.presence_of_element_located((By.NAME, "status")))).select_by_value(
        "failed"
    )
    browser.find_element(By.NAME, "queue").send_keys("cpu")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _wait(browser).until(ec.url_contains("status=failed"))
    shots(browser, "tasks-failed")
    rows = browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")
    ids = {row.find_element(By.CSS_SELECTOR, "td a").text for row in rows}
    assert ids == {seeded.ocr, seeded.attack}
    assert all("failed" in row.text for row in rows)
    assert browser.current_url.startswith(_base(browser) + MOUNT + "/tasks?")


def _base(browser: Any) -> str:
    return "/".join(browser.current_url.split("/")[:3])


def test_a_task_page_links_its_parent_and_the_link_leads_there(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any, shots: Any
) -> None:
    browser.get(_site(serve, broker) + f"/tasks/{seeded.generate}")
    parents = _wait(browser).until(ec.presence_of_element_located((By.ID, "parents")))
    shots(browser, "task-generate")
    parents.find_element(By.LINK_TEXT, seeded.retrieve).click()
    _wait(browser).until(ec.url_to_be(_base(browser) + MOUNT + f"/tasks/{seeded.retrieve}"))
    heading = browser.find_element(By.TAG_NAME, "h1").text
    assert seeded.retrieve in heading and "completed" in heading
    assert '"docs": [' in browser.find_element(By.ID, "result").text
    assert seeded.generate in browser.find_element(By.ID, "children").text
    shots(browser, "task-retrieve")


def test_a_failed_task_page_shows_its_error_and_traceback(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any, shots: Any
) -> None:
    browser.get(_site(serve, broker) + f"/tasks/{seeded.ocr}")
    error = _wait(browser).until(ec.presence_of_element_located((By.ID, "error")))
    assert error.text == "ValueError: unreadable scan"
    assert 'File "ocr.py"' in browser.find_element(By.ID, "traceback").text
    assert "89 50 4e 47" in browser.find_element(By.ID, "payload").text  # binary shown as hex
    shots(browser, "task-failed")


def test_with_actions_allowed_cancel_and_pause_work_from_the_page(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any, shots: Any
) -> None:
    site = _site(serve, broker, allow_actions=True)
    browser.get(site + f"/tasks/{seeded.waiting}")
    _wait(browser).until(ec.element_to_be_clickable((By.XPATH, "//button[text()='Cancel']"))).click()
    _wait(browser).until(ec.text_to_be_present_in_element((By.TAG_NAME, "h1"), "canceled"))
    shots(browser, "task-canceled")
    assert broker.get(seeded.waiting).status is Status.CANCELED

    browser.get(site + "/")
    row = "//table[@id='queues']//tr[td[1][normalize-space()='cpu']]"
    _wait(browser).until(ec.presence_of_element_located((By.XPATH, row + "//input[@name='for']"))).send_keys(
        "10m"
    )
    browser.find_element(By.XPATH, row + "//button[text()='Pause']").click()
    _wait(browser).until(ec.presence_of_element_located((By.XPATH, row + "//button[text()='Resume']")))
    shots(browser, "overview-paused")
    assert browser.find_element(By.XPATH, row + "/td[10]").text.endswith("UTC")


def test_markup_in_a_payload_error_and_type_is_shown_and_never_run(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any, shots: Any
) -> None:
    site = _site(serve, broker)
    for path in (f"/tasks/{seeded.attack}", "/", "/tasks"):
        browser.get(site + path)
        _wait(browser).until(ec.presence_of_element_located((By.TAG_NAME, "h1")))
        assert browser.execute_script("return window.__pwned === undefined") is True
        assert ATTACK in browser.find_element(By.TAG_NAME, "main").text
    browser.get(site + f"/tasks/{seeded.attack}")
    _wait(browser).until(ec.presence_of_element_located((By.ID, "payload")))
    assert ATTACK in browser.find_element(By.ID, "error").text
    shots(browser, "task-markup")


def test_a_count_on_the_overview_leads_to_the_list_of_those_tasks(
    serve: Callable[[Any], Served], tmp_path: Path, browser: Any, shots: Any
) -> None:
    broker = SQLBroker(f"sqlite:///{tmp_path / 'busy.db'}")
    busy(broker)
    browser.set_window_size(1100, 660)  # the README's screenshot: docs/dashboard.png
    browser.get(_site(serve, broker) + "/")
    cell = "//table[@id='counts']//tr[td[1][normalize-space()='generate']]/td[3]/a"  # generate, pending
    link = _wait(browser).until(ec.element_to_be_clickable((By.XPATH, cell)))
    shots(browser, "overview-busy")
    assert link.text == "2"
    link.click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "tasks")))
    rows = browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")
    assert len(rows) == 2 and all("generate" in row.text and "pending" in row.text for row in rows)
    broker.close()


def test_without_javascript_filters_links_and_actions_still_work(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser_without_js: Any, shots: Any
) -> None:
    browser = browser_without_js
    site = _site(serve, broker, allow_actions=True)
    browser.get(site + "/tasks")
    assert browser.find_element(By.ID, "refresh-toggle").is_displayed() is False  # needs the script
    browser.find_element(By.NAME, "type").send_keys("ocr")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _wait(browser).until(ec.url_contains("type=ocr"))
    browser.find_element(By.LINK_TEXT, seeded.waiting).click()
    _wait(browser).until(ec.element_to_be_clickable((By.XPATH, "//button[text()='Cancel']"))).click()
    _wait(browser).until(ec.text_to_be_present_in_element((By.TAG_NAME, "h1"), "canceled"))
    shots(browser, "no-javascript-canceled")
    assert broker.get(seeded.waiting).status is Status.CANCELED


def test_with_refresh_ticked_the_page_follows_the_store(
    serve: Callable[[Any], Served], broker: Broker, seeded: Seeded, browser: Any
) -> None:
    browser.get(_site(serve, broker, refresh=1) + f"/tasks/{seeded.waiting}")
    _wait(browser).until(ec.element_to_be_clickable((By.ID, "autorefresh"))).click()
    assert "pending" in browser.find_element(By.TAG_NAME, "h1").text
    broker.cancel(seeded.waiting)  # another process changes the store
    _wait(browser).until(ec.text_to_be_present_in_element((By.TAG_NAME, "h1"), "canceled"))
    browser.refresh()  # the choice is remembered
    _wait(browser).until(ec.element_located_selection_state_to_be((By.ID, "autorefresh"), True))
