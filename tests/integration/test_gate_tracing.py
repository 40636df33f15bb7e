"""OpenTelemetry: a submit's PRODUCER span is the parent of the run's CONSUMER span, across two
processes -- one submits, another runs the task -- through the context stored with the task.
Each process exports its spans to a file (`traced_process.py`); the test joins them."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD as WAIT
from gate_helpers import eventually, make_gate
from helpers.redis_servers import purge_prefix
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from taskgate import Backoff, QueueConfig, Status, Task
from taskgate.brokers.memory import MemoryBroker

HERE = Path(__file__).parent
GUARD = 60.0


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A store two processes share, and its key prefix (Redis)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'traced.db'}", ""
    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("unique_prefix")

    request.addfinalizer(functools.partial(purge_prefix, url, prefix))
    return url, prefix


def run_process(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(HERE / "traced_process.py"), *args],
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def spans(path: Path) -> dict[str, dict[str, Any]]:
    return {span["name"]: span for span in json.loads(path.read_text())}


def test_the_run_span_in_the_worker_is_a_child_of_the_submit_span_in_the_producer(
    store: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = store
    produced, worked = tmp_path / "producer.json", tmp_path / "worker.json"
    task_id = run_process("producer", url, prefix, str(produced))
    run_process("worker", url, prefix, str(worked), task_id)

    producer_side, worker_side = spans(produced), spans(worked)
    submit, run = producer_side["taskgate submit summarize"], worker_side["taskgate run summarize"]
    assert submit["kind"] == "PRODUCER" and run["kind"] == "CONSUMER"
    assert submit["attributes"] == {
        "taskgate.queue": "summarize",
        "taskgate.task.type": "summarize",
        "taskgate.task.id": task_id,
    }
    assert submit["parent_span_id"] == producer_side["handle request"]["span_id"]
    assert run["parent_span_id"] == submit["span_id"]
    assert run["trace_id"] == run["parent_trace_id"] == submit["trace_id"]
    assert run["attributes"] == {
        "taskgate.task.id": task_id,
        "taskgate.queue": "summarize",
        "taskgate.attempt": 1,
        "taskgate.outcome": "completed",
    }
    model_call = worker_side["call model"]  # the handler's own span: a child of the run's
    assert model_call["parent_span_id"] == run["span_id"] and model_call["trace_id"] == submit["trace_id"]


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """This process's global tracer provider (set once: OpenTelemetry refuses a second),
    exporting to memory; shut down after this module, so later tests keep nothing."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace.set_tracer_provider(provider)
    yield exported
    exported.clear()
    exported.shutdown()


@pytest.mark.anyio
async def test_a_run_span_records_a_retry_and_a_failure_as_errors(exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    gate = make_gate(MemoryBroker(), {"flaky": QueueConfig(workers=1)})

    @gate.handler("flaky", backoff=Backoff(base="10ms", jitter=0))
    async def flaky(task: Task) -> None:
        raise ValueError(f"try {task.attempts + 1}")

    async with gate:
        task_id = await gate.submit("flaky", max_retry=1)
        await eventually(gate, task_id, lambda t: t.status is Status.FAILED)
    runs = [s for s in exporter.get_finished_spans() if s.name == "taskgate run flaky"]
    (submit,) = [s for s in exporter.get_finished_spans() if s.name == "taskgate submit flaky"]
    assert [(s.attributes or {})["taskgate.attempt"] for s in runs] == [1, 2]
    assert [(s.attributes or {})["taskgate.outcome"] for s in runs] == ["retried", "failed"]
    assert [s.status.description for s in runs] == ["ValueError: try 1", "ValueError: try 2"]
    assert all(s.parent is not None and s.parent.span_id == submit.context.span_id for s in runs)


@pytest.mark.anyio
async def test_a_canceled_run_ends_its_span_as_canceled(exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    gate = make_gate(MemoryBroker(), {"slow": QueueConfig(workers=1)})
    started = anyio.Event()

    @gate.handler("slow")
    async def slow(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()

    async with gate:
        task_id = await gate.submit("slow")
        with anyio.fail_after(WAIT):
            await started.wait()
        await gate.cancel(task_id)
        await eventually(gate, task_id, lambda t: t.status is Status.CANCELED)
    (run,) = [s for s in exporter.get_finished_spans() if s.name == "taskgate run slow"]
    assert (run.attributes or {})["taskgate.outcome"] == "canceled"


def test_without_opentelemetry_a_gate_submits_and_runs_and_stores_no_context() -> None:
    code = """
import anyio
from taskgate import Config, Gate, QueueConfig
from taskgate.brokers.memory import MemoryBroker

async def main():
    gate = Gate(Config(broker=MemoryBroker(), queues={"q": QueueConfig(workers=1)}), poll_interval=0.02)
    async def work(task):
        return 1
    gate.handle("q", work)
    async with gate:
        task_id = await gate.submit("q")
        assert await gate.wait_json(task_id, timeout=10) == 1
    assert (await gate.get(task_id)).trace_context is None
    print("ok")

anyio.run(main)
"""
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\nsys.modules['opentelemetry'] = None\n{code}"],
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    assert done.stdout.strip() == "ok", done.stderr
