"""Helpers of the contract suite: task builders, shortcuts and a thread race runner."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar, cast

import pytest

from taskgate.brokers.base import Broker, FailureKind, Lease, NewTask
from taskgate.brokers.params import Complete
from taskgate.ids import new_id
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps

__all__ = [
    "JOIN_TIMEOUT",
    "RACE_ROUNDS",
    "TTL",
    "Outcome",
    "ack_item",
    "assert_refused",
    "claim_many",
    "claim_one",
    "new_task",
    "nonzero_counts",
    "race",
    "race_pair",
    "stored_state",
    "submit",
]

# How many times each race test is repeated: enough to hit both orders on a busy machine,
# few enough to keep server backends well under half a minute for the whole suite.
RACE_ROUNDS = 5

# The lease every contract claim uses; tests move the ManualClock past it instead of sleeping.
TTL = timedelta(seconds=30)

# Upper bound for a race's threads to finish; reaching it means a deadlock, not slowness.
JOIN_TIMEOUT = 60.0

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")


def new_task(*, queue: str = "q", type: str = "t", id: str | None = None, **fields: Any) -> NewTask:
    """A `NewTask` with a fresh ULID unless ``id`` is given; other fields as keywords."""
    return NewTask(id=id or new_id(), type=type, queue=queue, **fields)


def submit(broker: Broker, **fields: Any) -> Task:
    """Enqueue one task built by `new_task` and return its snapshot."""
    (task,) = steps.enqueue(broker, [new_task(**fields)])
    return task


def claim_many(broker: Broker, n: int, queue: str = "q") -> list[Lease]:
    """Submit ``n`` tasks to ``queue`` and claim exactly those ``n``."""
    for _ in range(n):
        submit(broker, queue=queue)
    leases = steps.claim(broker, queue, n, TTL)
    assert len(leases) == n
    return leases


def ack_item(lease: Lease, result: bytes | None = None) -> Complete:
    """The `Complete` item of ``lease``'s task with ``result``."""
    return Complete(lease.task.id, lease.token, result)


def claim_one(broker: Broker, queue: str = "q", ttl: timedelta = TTL) -> Lease:
    """Claim exactly one task of ``queue``; fails the test when there is none."""
    leases = steps.claim(broker, queue, 1, ttl)
    assert len(leases) == 1, f"expected one claimable task in {queue!r}, got {len(leases)}"
    return leases[0]


def nonzero_counts(broker: Broker) -> dict[str, dict[Status, int]]:
    """`Broker.counts` without zero entries (brokers may or may not report them)."""
    result: dict[str, dict[Status, int]] = {}
    for task_type, by_status in broker.counts().items():
        kept = {Status(s): n for s, n in by_status.items() if n}
        if kept:
            result[task_type] = kept
    return result


def stored_state(broker: Broker) -> tuple[list[Task], dict[str, dict[Status, int]]]:
    """Every task as stored, and the counts: what a refused call must leave as it was."""
    return broker.list(Filter()), nonzero_counts(broker)


def assert_refused(broker: Broker, call: Callable[[], object], field: str) -> None:
    """``call`` raises a `ValueError` matching ``field`` and leaves every task as it was."""
    before = stored_state(broker)
    with pytest.raises(ValueError, match=field):
        call()
    assert stored_state(broker) == before


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What one racing thread ended with: a value or an exception."""

    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """True when the thread returned normally."""
        return self.error is None


def race(actions: Sequence[Callable[[], T]]) -> list[Outcome[T]]:
    """Run ``actions`` in threads released together by a barrier; outcomes in the same order."""
    barrier = threading.Barrier(len(actions))
    outcomes: list[Outcome[T] | None] = [None] * len(actions)

    def run(index: int, action: Callable[[], T]) -> None:
        barrier.wait()
        try:
            outcomes[index] = Outcome(value=action())
        except Exception as exc:
            outcomes[index] = Outcome(error=exc)

    threads = [threading.Thread(target=run, args=(i, a), daemon=True) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a racing thread did not finish (deadlock?)"
    return [o for o in outcomes if o is not None]


def race_pair(first: Callable[[], A], second: Callable[[], B]) -> tuple[Outcome[A], Outcome[B]]:
    """`race` of two actions with different result types."""
    one, two = race([first, second])
    return cast("Outcome[A]", one), cast("Outcome[B]", two)


def every_snapshot(broker: Broker, **fields: Any) -> list[Task]:
    """Submit one task with ``fields``, run it through a retry to completion, and collect each
    snapshot of it the broker answered on the way: the submit's, both claims', the retry's,
    the ack's, `get`'s, `list`'s and the business key's executions."""
    (submitted,) = steps.enqueue(broker, [new_task(business_key=f"k-{new_id()}", **fields)])
    lease = claim_one(broker)
    retried = steps.retry(
        broker, lease.task.id, lease.token, kind=FailureKind.BUSINESS, error="boom", delay=timedelta(0)
    )
    again = claim_one(broker)
    (acked,) = steps.ack_many(broker, [(again.task.id, again.token, None)])
    assert isinstance(acked, Task)
    listed = broker.list(Filter())
    history = steps.history(broker, str(submitted.business_key))
    return [submitted, lease.task, retried, again.task, acked, broker.get(submitted.id), *listed, *history]
