"""Gate end to end on one broker: handlers, submit options and errors, queries, dependencies, hooks."""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from gate_helpers import GUARD, Faulty, eventually, make_gate, until

from taskgate import (
    ConfigError,
    Filter,
    QueueConfig,
    ShutdownError,
    Status,
    Task,
    TaskExistsError,
    TaskNotFoundError,
)
from taskgate.brokers.base import Capabilities

pytestmark = pytest.mark.anyio


async def test_handlers_results_are_stored_bytes_none_or_json(gate_broker):
    gate = make_gate(gate_broker, routes={"raw": "q", "nothing": "q", "echo": "q"})
    gate.handle("raw", lambda task: b"\x00raw")  # plain def: runs in a worker thread
    gate.handle("nothing", lambda task: None)

    @gate.handler("echo")
    async def echo(task: Task) -> object:
        return {"got": task.json()}

    async with gate:
        raw = await gate.submit("raw")
        nothing = await gate.submit("nothing")
        echoed = await gate.submit("echo", {"n": 1})
        assert await gate.wait(raw, timeout=GUARD) == b"\x00raw"
        assert await gate.wait(nothing, timeout=GUARD) is None
        assert await gate.wait(echoed, timeout=GUARD) == b'{"got":{"n":1}}'
    done = await gate.get(echoed)
    assert done.status is Status.COMPLETED and done.claims == 1 and done.attempts == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"payload": object()}, TypeError, "payload"),
        ({"delay": "soon"}, ValueError, "delay"),
        ({"delay": -1}, ValueError, "delay"),
        ({"run_at": datetime(2030, 1, 1)}, ValueError, "run_at"),
        ({"run_at": "tomorrow"}, TypeError, "run_at"),
        ({"max_retry": -1}, ValueError, "max_retry"),
        ({"depends_on": "abc"}, TypeError, "depends_on"),
        ({"business_key": ""}, ValueError, "business_key"),
    ],
)
async def test_bad_submit_arguments_raise_naming_them_and_store_nothing(gate_broker, kwargs, error, names):
    gate = make_gate(gate_broker)
    with pytest.raises(error, match=names):
        await gate.submit("q", **kwargs)
    assert await gate.list() == []


async def test_empty_type_and_unconfigured_queue_are_rejected(gate_broker):
    gate = make_gate(gate_broker)
    with pytest.raises(ValueError, match="task type"):
        await gate.submit("")
    with pytest.raises(ConfigError, match="nowhere"):
        await gate.submit("nowhere")
    with pytest.raises(ConfigError, match="nowhere"):
        gate.handle("nowhere", lambda task: None)
    assert await gate.list() == []


async def test_delay_forms_and_run_at_wins(gate_broker, clock):
    gate = make_gate(gate_broker)
    now = clock.now()
    for delay in ("10s", 10, timedelta(seconds=10)):
        task = await gate.get(await gate.submit("q", delay=delay))
        assert task.run_at == now + timedelta(seconds=10)
    later = datetime(2031, 5, 1, tzinfo=UTC)
    task = await gate.get(await gate.submit("q", delay="10s", run_at=later))
    assert task.run_at == later


async def test_submit_many_is_one_all_or_nothing_batch(gate_broker):
    gate = make_gate(gate_broker)
    ids = await gate.submit_many("q", [1, 2, 3], max_retry=2)
    tasks = [await gate.get(i) for i in ids]
    assert [t.json() for t in tasks] == [1, 2, 3] and all(t.max_retry == 2 for t in tasks)
    with pytest.raises(TypeError, match="payload"):
        await gate.submit_many("q", [4, object()])
    with pytest.raises(TaskNotFoundError):
        await gate.submit_many("q", [5, 6], depends_on=["01NOSUCHPARENT0000000000000"])
    assert len(await gate.list()) == 3


async def test_a_used_business_key_raises_task_exists_with_the_newest_execution(gate_broker):
    gate = make_gate(gate_broker)
    first = await gate.submit("q", business_key="order-1")
    with pytest.raises(TaskExistsError) as exists:
        await gate.submit("q", business_key="order-1")
    assert (exists.value.execution_id, exists.value.status) == (first, Status.PENDING)
    assert len(await gate.list()) == 1


async def test_submit_after_shutdown_raises(gate_broker):
    gate = make_gate(gate_broker)
    async with gate:
        pass
    with pytest.raises(ShutdownError):
        await gate.submit("q")


async def test_quota_on_a_broker_without_shared_quota_is_a_config_error(gate_broker):
    plain = Faulty(gate_broker, capabilities=Capabilities())
    queues = {"q": QueueConfig(workers=1, quota_limit=5, quota_period="1h")}
    with pytest.raises(ConfigError, match="quota_limit=5"):
        make_gate(plain, queues)


async def test_max_retry_defaults_to_config(gate_broker):
    gate = make_gate(gate_broker, max_retry=4)
    assert (await gate.get(await gate.submit("q"))).max_retry == 4
    assert (await gate.get(await gate.submit("q", max_retry=0))).max_retry == 0


async def test_dependency_chain_runs_in_order_and_list_history_overview(gate_broker):
    gate = make_gate(gate_broker)
    order: list[str] = []

    @gate.handler("q")
    async def step(task: Task) -> str:
        order.append(task.json())
        return task.json()

    async with gate:
        first = await gate.submit("q", "a", business_key="chain-a")
        second = await gate.submit("q", "b", depends_on=[first])
        third = await gate.submit("q", "c", depends_on=[second])
        assert await gate.wait(third, timeout=GUARD) == b'"c"'
    assert order == ["a", "b", "c"]
    assert [t.id for t in await gate.list(status=Status.COMPLETED)] == [first, second, third]
    assert [t.id for t in await gate.list(Filter(limit=1, offset=1))] == [second]
    assert [t.id for t in await gate.history("chain-a")] == [first]
    assert (await gate.overview())["q"][Status.COMPLETED] == 3
    with pytest.raises(TypeError, match="colour"):
        await gate.list(colour="red")


async def test_replay_makes_a_new_execution(gate_broker):
    gate = make_gate(gate_broker)
    gate.handle("q", lambda task: task.json())
    async with gate:
        old = await gate.submit("q", 1, business_key="k1")
        await gate.wait(old, timeout=GUARD)
        new = await gate.replay_by_key("k1", allow_completed=True, payload=2)
        assert await gate.wait(new, timeout=GUARD) == b"2"
    assert (await gate.get(new)).replay_of == old
    assert [t.id for t in await gate.history("k1")] == [old, new]
    with pytest.raises(TaskNotFoundError):
        await gate.replay_by_key("no-such-key")


async def test_wait_timeout_raises_and_leaves_the_task_running(gate_broker):
    gate = make_gate(gate_broker)
    release = anyio.Event()

    @gate.handler("q")
    async def slow(task: Task) -> None:
        await release.wait()

    async with gate:
        task_id = await gate.submit("q")
        await eventually(gate, task_id, lambda t: t.status is Status.RUNNING)
        with pytest.raises(TimeoutError):
            await gate.wait(task_id, timeout=0.05)
        assert (await gate.get(task_id)).status is Status.RUNNING
        release.set()
        assert await gate.wait(task_id, timeout=GUARD) is None


async def test_a_task_finishing_in_this_process_wakes_its_waiter_at_once(gate_broker):
    # The waiter's own poll is 2.5 poll intervals (25 s here): only the runtime's notice of the
    # ack it wrote can answer it within the test's second.
    gate = make_gate(gate_broker, poll_interval=10.0)
    release = anyio.Event()

    @gate.handler("q")
    async def held(task: Task) -> str:
        await release.wait()
        return "done"

    async def waiting() -> bool:
        return task_id in gate._runtime.waiters._events  # the waiter has registered

    answer: list[bytes | None] = []
    async with gate:
        task_id = await gate.submit("q")
        await eventually(gate, task_id, lambda t: t.status is Status.RUNNING)

        async def wait() -> None:
            answer.append(await gate.wait(task_id))

        try:
            with anyio.fail_after(1.0):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await until(waiting)
                    release.set()
        finally:
            release.set()  # a failed wait must not leave the handler holding up the shutdown
    assert answer == [b'"done"']


async def test_hook_errors_are_swallowed_and_a_slow_hook_blocks_no_worker(gate_broker, caplog):
    unblock = anyio.Event()
    seen: list[tuple[str, Status]] = []

    async def hook(task: Task) -> None:
        seen.append((task.id, task.status))
        if task.status is Status.COMPLETED:
            await unblock.wait()  # a slow hook: later deliveries wait, workers do not
        raise RuntimeError("hook is broken")

    gate = make_gate(gate_broker, on_state_change=hook)
    gate.handle("q", lambda task: None)
    caplog.set_level(logging.ERROR, logger="taskgate")
    async with gate:
        ids = [await gate.submit("q") for _ in range(3)]
        for task_id in ids:
            assert await gate.wait(task_id, timeout=GUARD) is None
        unblock.set()
    statuses = {status for task_id, status in seen if task_id == ids[-1]}
    assert {Status.PENDING, Status.RUNNING, Status.COMPLETED} <= statuses
    assert "hook is broken" in caplog.text or "on_state_change" in caplog.text


async def test_a_sync_hook_is_called_too(gate_broker):
    seen: list[Status] = []
    gate = make_gate(gate_broker, on_state_change=lambda task: seen.append(task.status))
    gate.handle("q", lambda task: None)
    async with gate:
        await gate.wait(await gate.submit("q"), timeout=GUARD)
    assert seen == [Status.PENDING, Status.RUNNING, Status.COMPLETED]


async def test_a_gate_run_for_some_queues_claims_from_those_only(gate_broker):
    queues = {"mine": QueueConfig(workers=1), "theirs": QueueConfig(workers=1)}
    gate = make_gate(gate_broker, queues, routes={"a": "mine", "b": "theirs"})
    gate.handle("a", lambda task: "a")
    gate.handle("b", lambda task: "b")
    with pytest.raises(ConfigError, match="unknown queue 'elsewhere'"):
        await gate.run(queues=["mine", "elsewhere"])
    async with anyio.create_task_group() as tg:
        await tg.start(functools.partial(gate.run, queues=["mine"]))
        ours, other = await gate.submit("a"), await gate.submit("b")
        assert await gate.wait_json(ours, timeout=GUARD) == "a"
        await gate.shutdown()
    assert (await gate.get(other)).status is Status.PENDING
