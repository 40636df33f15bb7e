"""`taskgate.metrics.Prometheus`: after a small workload on each of the five backends, the text
``prometheus_client.generate_latest`` serves holds every metric the SPEC pins, with its labels,
and figures that match what ran. The broker's `ManualClock` moves a hung lease past its end
(the reaper takes it back: ``lease_lost``) without any sleep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate, until
from prometheus_client import CollectorRegistry, generate_latest

from taskgate import BrokerError, ConfigError, ManualClock, QueueConfig, SkipRetry, Status, Task, Throttled
from taskgate.brokers.base import Broker
from taskgate.brokers.memory import MemoryBroker
from taskgate.metrics import Prometheus

pytestmark = pytest.mark.anyio

QUEUES = {
    "q": QueueConfig(workers=4, quota_limit=100, quota_period="1h", lease_ttl="1h"),
    "lease": QueueConfig(workers=1, manual_heartbeat=True, lease_ttl="60s"),
}
ROUTES = {"ok": "q", "boom": "q", "again": "q", "busy": "q", "slow": "q", "hang": "lease"}

PINNED = [
    'taskgate_submitted_total{queue="q",type="ok"} 2.0',
    'taskgate_started_total{queue="q",type="ok"} 2.0',
    'taskgate_finished_total{outcome="completed",queue="q",type="ok"} 2.0',
    'taskgate_finished_total{outcome="failed",queue="q",type="boom"} 1.0',
    'taskgate_finished_total{outcome="retried",queue="q",type="again"} 1.0',
    'taskgate_finished_total{outcome="throttled",queue="q",type="busy"} 1.0',
    'taskgate_finished_total{outcome="canceled",queue="q",type="slow"} 1.0',
    'taskgate_finished_total{outcome="lease_lost",queue="lease",type="hang"} 1.0',
    'taskgate_submit_duration_seconds_count{queue="q"}',
    'taskgate_wait_seconds_count{queue="q"}',
    'taskgate_run_seconds_count{queue="q",type="ok"} 2.0',
    'taskgate_queue_depth{queue="q",status="retrying"} 1.0',
    'taskgate_queue_depth{queue="q",status="pending"} 0.0',
    'taskgate_running{queue="q"} 0.0',
    'taskgate_quota_used{quota_key="q"}',
    'taskgate_quota_limit{quota_key="q"} 100.0',
    'taskgate_errors_total{kind="ValueError",queue="q"} 3.0',
    'taskgate_errors_total{kind="Throttled",queue="q"} 1.0',
]


def workload_gate(broker: Broker, metrics: Prometheus, reached: dict[str, anyio.Event]) -> Any:
    gate = make_gate(broker, QUEUES, routes=ROUTES, middleware=[metrics], reap_interval=0.02)

    @gate.handler("ok")
    async def ok(task: Task) -> str:
        return "fine"

    @gate.handler("boom")
    async def boom(task: Task) -> None:
        raise ValueError("broken input")

    @gate.handler("again")
    async def again(task: Task) -> None:
        raise ValueError("try later")

    @gate.handler("busy")
    async def busy(task: Task) -> None:
        raise Throttled(3600, "gateway busy")

    @gate.handler("slow")
    async def slow(task: Task) -> None:
        reached["slow"].set()
        await anyio.sleep_forever()

    @gate.handler("hang")
    async def hang(task: Task) -> str:
        if task.claims > 1:
            return "recovered"
        reached["hang"].set()
        await anyio.sleep_forever()

    return gate


async def test_every_pinned_metric_is_served_after_a_small_workload(
    broker: Broker, clock: ManualClock
) -> None:
    registry = CollectorRegistry()
    metrics = Prometheus(registry)
    reached = {"slow": anyio.Event(), "hang": anyio.Event()}
    gate = workload_gate(broker, metrics, reached)
    async with gate:
        ok_ids = await gate.submit_many("ok", [1, 2])
        await gate.submit("boom")
        await gate.submit("again", max_retry=1)
        await gate.submit("busy")
        slow_id, hang_id = await gate.submit("slow"), await gate.submit("hang")
        with anyio.fail_after(GUARD):
            await reached["slow"].wait()
            await reached["hang"].wait()
        await gate.cancel(slow_id)
        clock.advance(timedelta(seconds=61))  # the hung lease expires; "again" falls due once more
        assert await gate.wait_json(hang_id, timeout=GUARD) == "recovered"
        for task_id in ok_ids:
            await gate.wait(task_id, timeout=GUARD)
        await eventually(gate, slow_id, lambda t: t.status is Status.CANCELED)
        await until_counted(registry, "failed", "again")
    text = generate_latest(registry).decode()
    for line in PINNED:
        assert line in text, f"{line!r} missing from:\n{text}"


async def until_counted(registry: CollectorRegistry, outcome: str, task_type: str) -> None:
    """Wait (guarded) until a run of ``task_type`` ended with ``outcome`` is counted."""
    labels = {"queue": "q", "type": task_type, "outcome": outcome}
    await until(sampled(registry, "taskgate_finished_total", labels))


def sampled(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> Any:
    """An async predicate: the sample ``name{labels}`` is there and not 0."""

    async def check() -> bool:
        return bool(registry.get_sample_value(name, labels))

    return check


async def test_a_failing_broker_call_is_counted_as_a_broker_error_of_its_queue() -> None:
    registry = CollectorRegistry()
    faulty = Faulty(MemoryBroker())
    gate = make_gate(faulty, {"q": QueueConfig(workers=1)})
    gate.instrument(Prometheus(registry))
    faulty.failing["claim"] = BrokerError("store down")

    @gate.handler("q")
    async def work(task: Task) -> None:
        pass

    async with gate:
        await gate.submit("q")
        await until(sampled(registry, "taskgate_errors_total", {"queue": "q", "kind": "broker"}))
        del faulty.failing["claim"]


async def test_the_store_is_read_at_most_once_a_second_for_scrapes_in_a_burst() -> None:
    registry = CollectorRegistry()
    faulty = Faulty(MemoryBroker())
    gate = make_gate(faulty, {"q": QueueConfig(workers=1)}, middleware=[Prometheus(registry)])
    await gate.submit("q")
    for _ in range(5):
        text = generate_latest(registry).decode()
    assert 'taskgate_queue_depth{queue="q",status="pending"} 1.0' in text
    assert faulty.calls["counts"] == 1


async def test_a_skip_retry_is_a_failed_outcome_and_an_error_of_its_type(gate_broker: Broker) -> None:
    registry = CollectorRegistry()
    gate = make_gate(gate_broker, {"q": QueueConfig(workers=1)})
    gate.instrument(Prometheus(registry))

    @gate.handler("q")
    async def work(task: Task) -> None:
        raise SkipRetry("bad payload")

    async with gate:
        task_id = await gate.submit("q")
        await eventually(gate, task_id, lambda t: t.status is Status.FAILED)
        await until_counted(registry, "failed", "q")
    assert registry.get_sample_value("taskgate_errors_total", {"queue": "q", "kind": "SkipRetry"}) == 1


def test_instrument_refuses_what_is_not_a_coroutine_function() -> None:
    gate = make_gate(MemoryBroker())
    with pytest.raises(ConfigError, match=r"Gate.instrument\[0\]"):
        gate.instrument(print)  # type: ignore[arg-type]


async def test_a_scrape_that_cannot_read_the_store_counts_a_broker_error_and_serves_the_last_figures(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    faulty = Faulty(MemoryBroker())
    gate = make_gate(faulty, {"q": QueueConfig(workers=1)}, middleware=[Prometheus(registry)])
    await gate.submit("q")
    assert 'taskgate_queue_depth{queue="q",status="pending"} 1.0' in generate_latest(registry).decode()
    faulty.failing["counts"] = BrokerError("store down")
    monkeypatch.setattr("taskgate.metrics.store.MIN_AGE", 0.0)  # the next scrape reads again
    text = generate_latest(registry).decode()
    assert 'taskgate_queue_depth{queue="q",status="pending"} 1.0' in text
    assert 'taskgate_errors_total{kind="broker",queue=""} 1.0' in text
    assert any("metrics: reading the store failed: store down" in r.getMessage() for r in caplog.records)
