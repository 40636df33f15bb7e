"""Every example runs: imported from examples/ and run end to end with small inputs."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType

import pytest

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
