"""The dashboard's pages over HTTP, on memory, SQLite, PostgreSQL and Redis: links follow the mount
point, the list filters and pages, a task's page shows its replay chain and progress, and the
actions replay (with descendants), pause and resume."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from taskgate import Filter, Status, dashboard
from taskgate.brokers.base import Broker, FailureKind, NewTask
from taskgate.brokers.params import Claim, Fail, Heartbeat, Settle, Submit

from .seed import QUEUES, Seeded

FORM = {"content-type": "application/x-www-form-urlencoded"}


def _client(broker: Broker, **options: Any) -> TestClient:
    return TestClient(dashboard.app(broker, queues=QUEUES, **options), follow_redirects=False)


def _post(client: TestClient, page: str, path: str, **fields: str) -> Any:
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', client.get(page).text)
    assert token is not None
    body = "&".join(f"{k}={v}" for k, v in {"csrf_token": token.group(1), **fields}.items())
    return client.post(path, content=body, headers=FORM)


def test_mounted_under_a_prefix_every_link_and_redirect_stays_under_it(
    broker: Broker, seeded: Seeded
) -> None:
    host = Starlette(
        routes=[Mount("/ops/tasks", app=dashboard.app(broker, queues=QUEUES, allow_actions=True))]
    )
    client = TestClient(host, follow_redirects=False)
    page = client.get(f"/ops/tasks/tasks/{seeded.generate}").text
    links = re.findall(r'(?:href|action)="([^"]*)"', page)
    assert links and all(link.startswith("/ops/tasks/") for link in links)
    assert f'href="/ops/tasks/tasks/{seeded.retrieve}"' in page
    assert client.get(f"/ops/tasks/tasks/{seeded.retrieve}").status_code == 200
    answer = _post(client, "/ops/tasks/", "/ops/tasks/queues/llm/pause")
    assert answer.status_code == 303 and answer.headers["location"] == "/ops/tasks/"
    assert "taskgate_csrf" in client.cookies


def test_the_list_filters_by_each_field(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker)

    def ids(query: str) -> set[str]:
        return set(re.findall(r'href="/tasks/(01SEED\w+)"', client.get(f"/tasks?{query}").text))

    assert ids("type=ocr") == {seeded.ocr, seeded.waiting}
    assert ids("queue=llm") == {seeded.retrieve, seeded.generate}
    assert ids("status=blocked") == {seeded.score}
    assert ids(f"parent={seeded.retrieve}") == {seeded.generate}
    assert ids("business_key=scan-7") == {seeded.ocr}
    assert ids("group=nobody") == set()
    assert client.get("/tasks?status=sleeping").status_code == 400
    assert client.get("/tasks?limit=-1").status_code == 400


def test_the_list_pages_with_limit_and_offset_links(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker)
    first = client.get("/tasks?limit=4").text
    assert first.count('href="/tasks/01SEED') == 4
    nxt = re.search(r'rel="next" href="([^"]+)"', first)
    assert nxt is not None and 'rel="prev"' not in first
    second = client.get(nxt.group(1).replace("&amp;", "&")).text
    assert second.count('href="/tasks/01SEED') == 2
    assert 'rel="prev"' in second and 'rel="next"' not in second


def test_an_unknown_task_is_a_404_page(broker: Broker, seeded: Seeded) -> None:
    answer = _client(broker).get("/tasks/01NOSUCHTASK")
    assert answer.status_code == 404 and "01NOSUCHTASK" in answer.text


def test_a_task_page_shows_its_progress_and_pretty_json(broker: Broker, seeded: Seeded) -> None:
    lease = broker.claim(Claim("cpu", 1, timedelta(minutes=1), types=("ocr",))).leases[0]
    broker.heartbeat(
        Heartbeat(lease.task.id, lease.token, timedelta(minutes=1), progress='{"done": 3, "of": 7}')
    )
    page = _client(broker).get(f"/tasks/{lease.task.id}").text
    assert "Progress" in page and "&#34;done&#34;: 3" in page
    retrieve = _client(broker).get(f"/tasks/{seeded.retrieve}").text
    assert "{\n  &#34;q&#34;: &#34;why&#34;\n}" in retrieve  # the payload, indented


def test_replay_with_descendants_makes_a_chain_the_pages_link_both_ways(broker: Broker) -> None:
    broker.submit(
        Submit(
            (
                NewTask(
                    "01STAGEONE",
                    "extract",
                    "cpu",
                    payload=b'{"n": 1}',
                    business_key="job-1",
                ),
                NewTask("01STAGETWO", "load", "cpu", depends_on=("01STAGEONE",)),
            )
        )
    )
    lease = broker.claim(Claim("cpu", 1, timedelta(minutes=1))).leases[0]
    broker.settle(Settle((Fail(lease.task.id, lease.token, FailureKind.BUSINESS, "OSError: disk"),)))
    assert broker.get("01STAGETWO").status is Status.CANCELED
    client = _client(broker, allow_actions=True)

    answer = _post(client, "/tasks/01STAGEONE", "/tasks/01STAGEONE/replay", descendants="1")
    assert answer.status_code == 303
    new_id = answer.headers["location"].rsplit("/", 1)[1]
    assert broker.get(new_id).replay_of == "01STAGEONE"
    [new_child] = broker.list(Filter(parent=new_id))
    assert new_child.replay_of == "01STAGETWO"

    page = client.get(f"/tasks/{new_id}").text
    assert 'id="replays"' in page and 'href="/tasks/01STAGEONE"' in page
    assert f'href="/tasks/{new_child.id}"' in page  # its re-run child
    old = client.get("/tasks/01STAGEONE").text
    assert f'href="/tasks/{new_id}"' in old  # the newer execution, through the business key


def test_replaying_a_task_that_is_not_final_is_a_409_and_changes_nothing(
    broker: Broker, seeded: Seeded
) -> None:
    client = _client(broker, allow_actions=True)
    answer = _post(client, f"/tasks/{seeded.waiting}", f"/tasks/{seeded.waiting}/replay")
    assert answer.status_code == 409
    assert len(broker.list(Filter(type="ocr"))) == 2


def test_pause_for_a_while_then_resume_show_on_the_overview(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    assert _post(client, "/", "/queues/cpu/pause", **{"for": "10m"}).status_code == 303
    row = re.search(r"<tr>\s*<td[^>]*><a href=\"/tasks\?queue=cpu\">.*?</tr>", client.get("/").text, re.S)
    assert row is not None and "UTC" in row.group(0) and "Resume" in row.group(0)
    assert _post(client, "/", "/queues/cpu/resume").status_code == 303
    row = re.search(r"<tr>\s*<td[^>]*><a href=\"/tasks\?queue=cpu\">.*?</tr>", client.get("/").text, re.S)
    assert row is not None and "Pause" in row.group(0)
    assert _post(client, "/", "/queues/cpu/pause", **{"for": "soon"}).status_code == 400


def test_pause_without_a_time_holds_until_resumed(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    assert _post(client, "/", "/queues/llm/pause").status_code == 303
    assert "until resumed" in client.get("/").text


def test_without_queues_the_overview_shows_the_counts_only(broker: Broker, seeded: Seeded) -> None:
    page = TestClient(dashboard.app(broker)).get("/").text
    assert 'id="counts"' in page and 'id="queues"' not in page and "queues=" in page


def test_purge_deletes_the_final_tasks_it_selects_and_says_how_many(broker: Broker, seeded: Seeded) -> None:
    client = _client(broker, allow_actions=True)
    answer = _post(client, "/", "/purge", status="failed", queue="cpu", older_than="0s")
    assert answer.status_code == 303 and answer.headers["location"] == "/?purged=2"
    assert 'id="purged">2 final tasks deleted.' in client.get(answer.headers["location"]).text
    assert broker.list(Filter(status=Status.FAILED)) == []
    left = {t.id for t in broker.list(Filter())}
    assert left == {seeded.retrieve, seeded.generate, seeded.score, seeded.waiting}


def test_purge_of_a_status_that_is_not_final_is_a_400_and_deletes_nothing(
    broker: Broker, seeded: Seeded
) -> None:
    client = _client(broker, allow_actions=True)
    assert _post(client, "/", "/purge", status="pending").status_code == 400
    assert _post(client, "/", "/purge", older_than="a while").status_code == 400
    assert len(broker.list(Filter())) == 6
