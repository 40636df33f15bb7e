"""The dashboard's guards, over HTTP (Starlette's TestClient): read-only by default, actions
refused without ``allow_actions``, without the CSRF token and when ``auth`` says no -- each
refusal changing nothing -- escaping everywhere, and no secret in any URL."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.testclient import TestClient

from taskgate import Status, dashboard
from taskgate.brokers.base import Broker

from .seed import ATTACK, QUEUES, Seeded

FORM = {"content-type": "application/x-www-form-urlencoded"}


def _client(broker: Broker, **options: Any) -> TestClient:
    return TestClient(dashboard.app(broker, queues=QUEUES, **options), follow_redirects=False)


def _token(client: TestClient, path: str) -> str:
    """The CSRF token of the page at ``path`` (the client keeps its cookie)."""
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', client.get(path).text)
    assert found is not None
    return found.group(1)


def test_by_default_pages_carry_no_forms_and_every_action_answers_403(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker)
    page = client.get(f"/tasks/{seeded.waiting}").text + client.get("/").text
    assert 'method="post"' not in page and "csrf_token" not in page
    assert "taskgate_csrf" not in client.cookies
    for path in (
        f"/tasks/{seeded.waiting}/cancel",
        f"/tasks/{seeded.ocr}/replay",
        "/queues/cpu/pause",
        "/purge",
    ):
        assert client.post(path, content="csrf_token=x", headers=FORM).status_code == 403
    assert broker.get(seeded.waiting).status is Status.PENDING
    assert len(broker.list(broker_filter(type="ocr"))) == 2  # no replay made
    assert client.get("/").text.count("until resumed") == 0


def broker_filter(**fields: Any) -> Any:
    from taskgate import Filter

    return Filter(**fields)


@pytest.mark.parametrize("token", [None, "", "0" * 64, "not-a-token"])
def test_an_action_without_the_right_csrf_token_answers_403_and_changes_nothing(
    broker: Broker, seeded: Seeded, token: str | None
) -> None:
    client = _client(broker, allow_actions=True)
    _token(client, f"/tasks/{seeded.waiting}")
    body = "" if token is None else f"csrf_token={token}"
    answer = client.post(f"/tasks/{seeded.waiting}/cancel", content=body, headers=FORM)
    assert answer.status_code == 403
    assert "CSRF" in answer.text
    assert broker.get(seeded.waiting).status is Status.PENDING


def test_a_token_without_its_cookie_is_refused(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    token = _token(client, f"/tasks/{seeded.waiting}")
    client.cookies.clear()  # another browser: the token alone is not enough
    answer = client.post(f"/tasks/{seeded.waiting}/cancel", content=f"csrf_token={token}", headers=FORM)
    assert answer.status_code == 403
    assert broker.get(seeded.waiting).status is Status.PENDING


def test_a_token_of_another_dashboard_app_is_refused(broker: Broker, seeded: Seeded) -> None:
    other = _client(broker, allow_actions=True)
    token = _token(other, f"/tasks/{seeded.waiting}")
    client = _client(broker, allow_actions=True)
    _token(client, f"/tasks/{seeded.waiting}")
    client.cookies.set("taskgate_csrf", other.cookies["taskgate_csrf"])
    answer = client.post(f"/tasks/{seeded.waiting}/cancel", content=f"csrf_token={token}", headers=FORM)
    assert answer.status_code == 403
    assert broker.get(seeded.waiting).status is Status.PENDING


def test_with_the_token_an_action_is_done_and_redirects_to_its_page(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    token = _token(client, f"/tasks/{seeded.waiting}")
    answer = client.post(f"/tasks/{seeded.waiting}/cancel", content=f"csrf_token={token}", headers=FORM)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/tasks/{seeded.waiting}"
    assert broker.get(seeded.waiting).status is Status.CANCELED


def test_the_csrf_cookie_is_http_only_and_same_site_strict(broker: Broker, seeded: Seeded) -> None:
    cookie = _client(broker, allow_actions=True).get("/").headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


def test_when_auth_says_no_pages_and_actions_answer_403_and_nothing_changes(
    broker: Broker, seeded: Seeded
) -> None:
    asked: list[Request] = []

    def auth(request: Request) -> bool:
        asked.append(request)
        return False

    client = _client(broker, allow_actions=True, auth=auth)
    assert client.get("/").status_code == 403
    assert client.get(f"/tasks/{seeded.waiting}").status_code == 403
    answer = client.post(f"/tasks/{seeded.waiting}/cancel", content="csrf_token=x", headers=FORM)
    assert answer.status_code == 403
    assert ATTACK not in answer.text and seeded.waiting not in answer.text
    assert broker.get(seeded.waiting).status is Status.PENDING
    assert len(asked) == 3 and all(isinstance(r, Request) for r in asked)


def test_an_async_auth_saying_yes_lets_the_request_in(broker: Broker, seeded: Seeded) -> None:
    async def auth(request: Request) -> bool:
        return request.headers.get("x-operator") == "ada"

    client = _client(broker, auth=auth)
    assert client.get("/", headers={"x-operator": "ada"}).status_code == 200
    assert client.get("/", headers={"x-operator": "eve"}).status_code == 403


def test_auth_may_ask_for_credentials_with_a_401(broker: Broker, seeded: Seeded) -> None:
    def auth(request: Request) -> bool:
        raise HTTPException(401, headers={"WWW-Authenticate": 'Basic realm="tasks"'})

    answer = _client(broker, auth=auth).get("/")
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == 'Basic realm="tasks"'


def test_markup_in_stored_values_is_escaped_on_every_page(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    pages = [client.get(path).text for path in ("/", "/tasks", f"/tasks/{seeded.attack}")]
    for page in pages:
        assert "<script>window.__pwned" not in page
        assert "<img src=x" not in page
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert pages[2].count("&lt;img src=x onerror=") >= 3  # the type, the error and the traceback


def test_a_script_that_is_not_the_page_own_would_be_blocked_by_the_content_security_policy(
    broker: Broker, seeded: Seeded
) -> None:
    answer = _client(broker).get(f"/tasks/{seeded.attack}")
    policy = answer.headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", policy)
    assert nonce is not None and "unsafe-inline" not in policy
    assert answer.text.count(f'nonce="{nonce.group(1)}"') == 2  # the page's own style and script
    assert answer.headers["cache-control"] == "no-store"


def test_no_secret_appears_in_any_url(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    token = _token(client, f"/tasks/{seeded.waiting}")
    for path in ("/", "/tasks", f"/tasks/{seeded.waiting}", f"/tasks/{seeded.ocr}"):
        page = client.get(path).text
        urls = re.findall(r'(?:href|action)="([^"]*)"', page)
        assert urls and not any(token in url or client.cookies["taskgate_csrf"] in url for url in urls)
        for form in re.findall(r"<form[^>]*>.*?</form>", page, re.S):
            assert ('method="post"' in form) == ("csrf_token" in form)  # tokens go in POST bodies only


def test_broker_calls_run_in_worker_threads_never_on_the_event_loop(broker: Broker, seeded: Seeded) -> None:
    loop_threads: set[threading.Thread] = set()
    broker_threads: set[threading.Thread] = set()

    def auth(request: Request) -> bool:  # called on the event loop
        loop_threads.add(threading.current_thread())
        return True

    class Watched:
        def __getattr__(self, name: str) -> Any:
            method = getattr(broker, name)

            def call(*args: Any) -> Any:
                broker_threads.add(threading.current_thread())
                return method(*args)

            return call

    client = _client(Watched(), auth=auth)  # type: ignore[arg-type]
    for path in ("/", "/tasks", f"/tasks/{seeded.generate}"):
        assert client.get(path).status_code == 200
    assert broker_threads and loop_threads and not broker_threads & loop_threads


def test_a_body_that_is_no_form_carries_no_token_and_is_refused(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    token = _token(client, f"/tasks/{seeded.waiting}")
    as_json = client.post(f"/tasks/{seeded.waiting}/cancel", json={"csrf_token": token})
    assert as_json.status_code == 403
    too_big = client.post(f"/tasks/{seeded.waiting}/cancel", content="x=" + "y" * 20_000, headers=FORM)
    assert too_big.status_code == 400
    assert broker.get(seeded.waiting).status is Status.PENDING
