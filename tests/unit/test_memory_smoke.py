"""A quick walk through the memory broker's main paths (the contract suite covers the rest)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from taskgate.brokers.base import FailureKind, NewTask
from taskgate.brokers.memory import MemoryBroker
from taskgate.clock import ManualClock
from taskgate.errors import BrokerError, LeaseLostError
from taskgate.task import Filter, Status
from taskgate.testing import steps

TTL = timedelta(seconds=30)


def test_a_task_goes_from_pending_to_completed_and_wakes_its_child() -> None:
    clock = ManualClock()
    broker = MemoryBroker(clock=clock)
    parent, child = steps.enqueue(
        broker,
        [NewTask(id="p", type="t", queue="q"), NewTask(id="c", type="t", queue="q", depends_on=("p",))],
    )
    assert (parent.status, child.status) == (Status.PENDING, Status.BLOCKED)
    (lease,) = steps.claim(broker, "q", 10, TTL)
    assert lease.task.id == "p" and lease.task.started_at == clock.now()
    done = steps.ack(broker, "p", lease.token, b"ok")
    assert done.status is Status.COMPLETED and done.result == b"ok"
    assert broker.get("c").status is Status.PENDING
    assert broker.counts() == {"t": {Status.COMPLETED: 1, Status.PENDING: 1}}
    assert steps.queue_length(broker, "q") == 1


def test_a_reaped_lease_makes_the_old_token_stale() -> None:
    clock = ManualClock()
    broker = MemoryBroker(clock=clock)
    steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
    (lease,) = steps.claim(broker, "q", 1, TTL)
    clock.advance(TTL)
    (reaped,) = broker.reap(lease_lost_max=3)
    assert reaped.status is Status.PENDING and reaped.lease_lost == 1
    with pytest.raises(LeaseLostError):
        steps.retry(broker, "a", lease.token, kind=FailureKind.BUSINESS, error="x", delay=TTL)
    assert broker.list(Filter(status=Status.PENDING))[0].id == "a"


def test_close_wakes_a_waiter_and_closes_the_broker() -> None:
    broker = MemoryBroker()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(broker.wait_for_work(["q"], 30)))
    waiter.start()
    broker.close()
    waiter.join(5)
    assert results == [False]
    with pytest.raises(BrokerError):
        broker.get("a")
