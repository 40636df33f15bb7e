"""Every example runs: imported from examples/ and run end to end with small inputs."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from wsgiref.util import setup_testing_defaults

import anyio
import pytest

from taskgate.testing import drain

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _sqlite_available() -> bool:
    return importlib.util.find_spec("taskgate.brokers.sql") is not None


@pytest.mark.parametrize(
    "broker",
    [
        "memory://",
        pytest.param("sqlite", marks=pytest.mark.skipif(not _sqlite_available(), reason="no SQL broker")),
    ],
)
def test_llm_pipeline_runs_every_chain_to_a_final_state(broker: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipeline.db'}" if broker == "sqlite" else broker
    out = io.StringIO()
    summary = _load("llm_pipeline").main(["--chains", "4", "--broker", url, "--seed", "3"], out=out)
    assert summary["tasks"] == 12
    assert sum(summary["statuses"].values()) == 12
    assert set(summary["statuses"]) <= {"completed", "failed", "canceled"}
    assert summary["chains_completed"] >= 1
    assert summary["gateway_calls"] >= 4
    text = out.getvalue()
    assert "summary" in text and "throughput" in text and "retries" in text


def test_llm_pipeline_runs_on_trio_too() -> None:
    summary = _load("llm_pipeline").main(
        ["--chains", "2", "--broker", "memory://", "--backend", "trio"], out=io.StringIO()
    )
    assert sum(summary["statuses"].values()) == 6


def test_the_dashboard_example_shows_the_pipeline_store(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    url = f"sqlite:///{tmp_path / 'pipeline.db'}"
    _load("llm_pipeline").main(["--chains", "2", "--broker", url, "--seed", "3"], out=io.StringIO())
    with TestClient(_load("dashboard").make_app(url)) as client:
        overview = client.get("/")
        assert overview.status_code == 200 and str(overview.url).endswith("/tasks/")
        assert 'href="/tasks/tasks?type=score"' in overview.text and 'id="queues"' in overview.text
        assert client.get("/tasks/tasks?type=score").text.count('href="/tasks/tasks/') == 2


def _request(app: Any, method: str, path: str, query: str = "") -> tuple[str, Any]:
    """Call a WSGI app as a server would; its status line and decoded JSON body."""
    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query}
    setup_testing_defaults(environ)
    answer: list[str] = []
    body = b"".join(app(environ, lambda status, headers: answer.append(status)))
    return answer[0], json.loads(body)


@pytest.mark.anyio
async def test_wsgi_shop_ships_committed_orders_and_rolls_back_failed_ones_with_their_tasks(
    tmp_path: Path,
) -> None:
    shop = _load("wsgi_shop")
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    app, client = shop.make_app(url)
    with client:
        # The web requests come from plain threads, as a WSGI server's would, with no event loop.
        placed = await anyio.to_thread.run_sync(_request, app, "POST", "/orders", "item=lamp")
        refused = await anyio.to_thread.run_sync(_request, app, "POST", "/orders", "item=")
        assert placed[0] == "201 Created" and placed[1]["order"] == 1
        assert refused == ("400 Bad Request", {"error": "item is required"})

        (shipped,) = await drain(shop.make_worker(url), timeout=30)
        assert (shipped.id, shipped.result_json()) == (placed[1]["task"], "shipped lamp")
        status = await anyio.to_thread.run_sync(_request, app, "GET", f"/tasks/{shipped.id}")
        assert status == ("200 OK", {"status": "completed", "result": "shipped lamp"})
        assert [t.id for t in client.list()] == [shipped.id]  # the refused order queued nothing
