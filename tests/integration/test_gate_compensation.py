"""`handle(..., on_failure=)`: a task that fails for good starts its compensation, on every
backend -- submitted by the broker in the unit that wrote the failure (the contract's
`CompensationContract` pins the atomicity per backend; here the runtime's paths to a final
failure: retries used up, `SkipRetry`, a result the broker refuses, the reaper)."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from gate_helpers import GUARD, eventually, make_gate

from taskgate import ConfigError, QueueConfig, SkipRetry, Status, Task, TaskFailedError
from taskgate.brokers.base import Broker
from taskgate.clock import ManualClock

pytestmark = pytest.mark.anyio

QUEUES = {"charges": QueueConfig(workers=2), "undo": QueueConfig(workers=1)}
ROUTES = {"charge": "charges", "refund": "undo"}


async def test_a_task_failing_after_its_retries_starts_its_compensation(
    broker: Broker, clock: ManualClock
) -> None:
    gate = make_gate(broker, QUEUES, routes=ROUTES, max_retry=1)
    refunded = anyio.Event()
    seen: list[Task] = []

    @gate.handler("charge", on_failure="refund")
    async def charge(task: Task) -> None:
        raise ConnectionError("card declined")

    @gate.handler("refund")
    async def refund(task: Task) -> str:
        seen.append(task)
        refunded.set()
        return "refunded"

    async with gate:
        charge_id = await gate.submit("charge", {"amount": 5})
        await eventually(gate, charge_id, lambda t: t.status is Status.RETRYING)
        clock.advance(timedelta(minutes=5))  # past any backoff
        with pytest.raises(TaskFailedError):
            await gate.wait(charge_id, timeout=GUARD)
        with anyio.fail_after(GUARD):
            await refunded.wait()
        (compensation,) = seen
        assert compensation.json() == {"failed": charge_id}
        assert (compensation.queue, compensation.depends_on, compensation.max_retry) == ("undo", (), 1)
        assert await gate.wait_json(compensation.id, timeout=GUARD) == "refunded"
    assert [t.id for t in await gate.list(type="refund")] == [compensation.id]


async def test_skip_retry_fails_at_once_and_compensates_but_a_success_does_not(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, QUEUES, routes=ROUTES, max_retry=5)

    @gate.handler("charge", on_failure="refund")
    async def charge(task: Task) -> str:
        if task.json() == "bad":
            raise SkipRetry("card number invalid")
        return "charged"

    gate.handle("refund", lambda task: None)
    async with gate:
        bad, good = await gate.submit("charge", "bad"), await gate.submit("charge", "good")
        assert await gate.wait_json(good, timeout=GUARD) == "charged"
        with pytest.raises(TaskFailedError):
            await gate.wait(bad, timeout=GUARD)
        (refund,) = await gate.list(type="refund")
        assert refund.json() == {"failed": bad}
        await gate.wait(refund.id, timeout=GUARD)


async def test_a_task_the_reaper_fails_is_compensated(broker: Broker, clock: ManualClock) -> None:
    queues = {"charges": QueueConfig(workers=1, manual_heartbeat=True), "undo": QueueConfig(workers=1)}
    gate = make_gate(broker, queues, routes=ROUTES, lease_lost_max=1, reap_interval=0.02)
    started = anyio.Event()

    @gate.handler("charge", on_failure="refund")
    async def hangs(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()  # no heartbeat: the lease runs out, the reaper fails the task

    gate.handle("refund", lambda task: "refunded")
    async with gate:
        charge_id = await gate.submit("charge")
        with anyio.fail_after(GUARD):
            await started.wait()
        clock.advance(timedelta(minutes=2))
        failed = await eventually(gate, charge_id, lambda t: t.status is Status.FAILED)
        assert failed.lease_lost == 1
        refunds = []
        with anyio.fail_after(GUARD):
            while not refunds:
                refunds = await gate.list(type="refund")
                await anyio.sleep(0.005)
        assert refunds[0].json() == {"failed": charge_id}
        assert await gate.wait_json(refunds[0].id, timeout=GUARD) == "refunded"


async def test_a_result_the_broker_refuses_fails_the_task_with_its_compensation(gate_broker: Broker) -> None:
    gate = make_gate(gate_broker, QUEUES, routes=ROUTES)

    @gate.handler("charge", on_failure="refund")
    async def unencodable(task: Task) -> object:
        return {1, 2}  # a set is not JSON: the result cannot be stored

    gate.handle("refund", lambda task: None)
    async with gate:
        charge_id = await gate.submit("charge")
        with pytest.raises(TaskFailedError):
            await gate.wait(charge_id, timeout=GUARD)
        (refund,) = await gate.list(type="refund")
        assert refund.json() == {"failed": charge_id}


@pytest.mark.parametrize(
    ("on_failure", "error", "match"),
    [
        ("nowhere", ConfigError, "on_failure of 'charge' cannot be routed"),
        ("charge", ConfigError, "names the type itself"),
        (7, TypeError, "on_failure must be a str"),
        ("", ValueError, "on_failure must not be empty"),
    ],
)
async def test_a_bad_on_failure_is_refused_and_registers_nothing(
    gate_broker: Broker, on_failure: object, error: type[Exception], match: str
) -> None:
    gate = make_gate(gate_broker, QUEUES, routes=ROUTES)
    with pytest.raises(error, match=match):
        gate.handle("charge", lambda task: None, on_failure=on_failure)  # type: ignore[arg-type]
    gate.handle("charge", lambda task: "ok")  # nothing was registered: the type is still free
    async with gate:
        assert await gate.wait_json(await gate.submit("charge"), timeout=GUARD) == "ok"
