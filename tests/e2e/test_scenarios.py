"""taskgate against a gateway that misbehaves the way real ones do, on every backend.

Each scenario runs on memory, SQLite, PostgreSQL, MariaDB and Redis (the ``backend`` fixture)
and waits on conditions -- ``gate.wait`` and the gateway's counters -- never on sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import pytest

from taskgate import Filter, Gate, QueueConfig, Status, Task, TaskFailedError

from .backends import GateFactory
from .gateway import Counters, Gateway
from .handlers import (
    PIPELINE_ROUTES,
    complete_handler,
    expected_score,
    install_pipeline,
    stream_handler,
    submit_chain,
)

pytestmark = pytest.mark.anyio

WAIT = 30.0  # seconds; a scenario takes a few, this only bounds a broken run


async def until(gateway: Gateway, predicate: Callable[[Counters], bool]) -> Counters:
    """Wait (in a thread, so the event loop keeps running) until the gateway's counters match."""
    return await anyio.to_thread.run_sync(gateway.wait_until, predicate, WAIT)


async def wait_all(gate: Gate, ids: list[str]) -> list[bytes | None]:
    return [await gate.wait(task_id, timeout=WAIT) for task_id in ids]


async def snapshots(gate: Gate, ids: list[str]) -> list[Task]:
    return [await gate.get(task_id) for task_id in ids]


async def submit_prompts(gate: Gate, task_type: str, n: int, **options: object) -> list[str]:
    return [await gate.submit(task_type, {"prompt": f"prompt {i}"}, **options) for i in range(n)]


def outputs(results: list[bytes | None]) -> list[str]:
    return [json.loads(r) for r in results if r is not None]


async def test_the_queue_limit_keeps_the_gateway_below_its_busy_threshold(
    make_gate: GateFactory, gateway: Gateway
) -> None:
    workers = 3
    gateway.configure(latency=0.05, busy_above=workers)
    gate = make_gate(queues={"llm": QueueConfig(workers=workers)}, routes={"complete": "llm"})
    gate.handle("complete", complete_handler(gateway.url))
    async with gate:
        ids = await submit_prompts(gate, "complete", 15)
        results = await wait_all(gate, ids)
        tasks = await snapshots(gate, ids)
    assert outputs(results) == [f"PROMPT {i}" for i in range(15)]
    seen = gateway.settled()
    assert seen.busy == 0
    assert 2 <= seen.max_concurrency <= workers
    assert (seen.requests, seen.ok) == (15, 15)
    assert all((t.claims, t.attempts, t.throttled) == (1, 0, 0) for t in tasks)


async def test_busy_answers_become_throttled_requeues_and_every_task_completes(
    make_gate: GateFactory, gateway: Gateway
) -> None:
    gateway.configure(latency=0.05, busy_above=1)
    gate = make_gate(queues={"llm": QueueConfig(workers=3)}, routes={"complete": "llm"}, throttled_max=1000)
    gate.handle("complete", complete_handler(gateway.url))
    async with gate:
        ids = await submit_prompts(gate, "complete", 6)
        results = await wait_all(gate, ids)
        tasks = await snapshots(gate, ids)
        failed = await gate.list(Filter(status=Status.FAILED))
    assert outputs(results) == [f"PROMPT {i}" for i in range(6)]
    assert failed == []
    seen = gateway.settled()
    assert seen.busy > 0
    assert seen.ok == 6
    assert all(t.status is Status.COMPLETED and t.attempts == 0 for t in tasks)
    # Every busy answer is one Throttled re-queue, counted on its task and nowhere else.
    assert sum(t.throttled for t in tasks) == seen.busy
    assert sum(t.claims for t in tasks) == seen.requests


async def test_dropped_connections_and_500s_take_the_ordinary_retry_path(
    make_gate: GateFactory, gateway: Gateway
) -> None:
    # Two requests are held in flight and will get HTTP 500; every further one finds the
    # gateway over its limit and gets its connection reset. Then the gateway recovers.
    gateway.configure(hold=True, crash_above=2, fail_rate=1.0)
    gate = make_gate(queues={"llm": QueueConfig(workers=3)}, routes={"complete": "llm"}, max_retry=3)
    call = complete_handler(gateway.url)
    raised: list[str] = []

    def handle(task: Task) -> str:
        try:
            return call(task)
        except Exception as exc:  # noted, then raised on unchanged: the ordinary retry path
            raised.append("dropped" if isinstance(exc, ConnectionError) else type(exc).__name__)
            raise

    gate.handle("complete", handle)
    async with gate:
        ids = await submit_prompts(gate, "complete", 5)
        await until(gateway, lambda c: c.held == 2 and c.crashes == 3)
        gateway.configure(crash_above=None, fail_rate=0.0)
        gateway.release()
        results = await wait_all(gate, ids)
        tasks = await snapshots(gate, ids)
    assert outputs(results) == [f"PROMPT {i}" for i in range(5)]
    seen = gateway.settled()
    assert (seen.crashes, seen.failures, seen.ok, seen.requests) == (3, 2, 5, 10), (seen, raised)
    # Each failure is one attempt and one backoff retry; throttles and lease losses stay 0.
    assert all(t.status is Status.COMPLETED for t in tasks)
    assert all((t.attempts, t.claims, t.throttled, t.lease_lost) == (1, 2, 0, 0) for t in tasks), tasks
    assert sorted(raised) == ["GatewayHTTPError"] * 2 + ["dropped"] * 3


def pipeline_gate(make_gate: GateFactory, gateway: Gateway) -> Gate:
    gate = make_gate(
        queues={"ocr": QueueConfig(workers=3), "llm": QueueConfig(workers=2), "cpu": QueueConfig(workers=4)},
        routes=PIPELINE_ROUTES,
    )
    install_pipeline(gate, gateway.url)
    return gate


async def test_a_three_queue_pipeline_of_30_chains_passes_each_result_on(
    make_gate: GateFactory, gateway: Gateway
) -> None:
    gateway.configure(latency=0.01)
    gate = pipeline_gate(make_gate, gateway)
    async with gate:
        chains = [await submit_chain(gate, i) for i in range(30)]
        results = await wait_all(gate, [tail for _, _, tail in chains])
        tasks = await snapshots(gate, [tid for chain in chains for tid in chain])
    assert [json.loads(r) for r in results if r] == [expected_score(i) for i in range(30)]
    assert all(t.status is Status.COMPLETED and t.claims == 1 for t in tasks)
    seen = gateway.settled()
    # retrieve and generate call the gateway once each; score works on its parent's result.
    assert (seen.requests, seen.ok, seen.busy) == (60, 60, 0)


async def test_canceling_a_chain_head_mid_run_cancels_the_rest_of_the_chain(
    make_gate: GateFactory, gateway: Gateway
) -> None:
    gateway.configure(hold=True)
    gate = pipeline_gate(make_gate, gateway)
    async with gate:
        head, middle, tail = await submit_chain(gate, 0)
        await until(gateway, lambda c: c.held == 1 and c.tag(head) == 1)
        await gate.cancel(head)
        for task_id in (head, middle, tail):
            with pytest.raises(TaskFailedError) as info:
                await gate.wait(task_id, timeout=WAIT)
            assert info.value.task.status is Status.CANCELED
        gateway.release()
        # A later chain goes through the same three queues; once it is done, the canceled
        # chain has had every chance to run, had anything of it been left.
        later = await submit_chain(gate, 1)
        assert json.loads(await gate.wait(later[2], timeout=WAIT) or b"null") == expected_score(1)
        canceled = await snapshots(gate, [head, middle, tail])
    assert [t.status for t in canceled] == [Status.CANCELED] * 3
    assert [t.claims for t in canceled] == [1, 0, 0]
    seen = gateway.settled()
    assert (seen.tag(head), seen.tag(middle), seen.tag(tail)) == (1, 0, 0)
    assert seen.requests == 3  # the canceled head's one call, and the later chain's two


async def test_busy_hidden_in_an_sse_body_is_requeued_then_succeeds(
    make_gate: GateFactory, gateway: Gateway
) -> None:
    gateway.configure(busy_first=3)
    gate = make_gate(queues={"llm": QueueConfig(workers=2)}, routes={"chat": "llm"})
    gate.handle("chat", stream_handler(gateway.url))
    async with gate:
        ids = await submit_prompts(gate, "chat", 2)
        results = await wait_all(gate, ids)
        tasks = await snapshots(gate, ids)
    assert outputs(results) == ["PROMPT 0", "PROMPT 1"]
    assert all(t.status is Status.COMPLETED and t.attempts == 0 for t in tasks)
    assert sum(t.throttled for t in tasks) == 3
    seen = gateway.settled()
    assert (seen.requests, seen.busy, seen.ok) == (5, 3, 2)
