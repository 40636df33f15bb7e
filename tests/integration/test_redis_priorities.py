"""Redis: how priorities are stored. A task of priority 0 is stored exactly as before priorities
existed (no ``priority`` field, in ``queue:<queue>``), so tasks stored by an earlier version are
tasks of priority 0; another priority has its own sets (``pqueue:<p>:<queue>``), listed in
``prios:<queue>`` while it may hold tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from taskgate.brokers.params import Claim, QueueQuery
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.clock import ManualClock
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

TTL = timedelta(seconds=30)
START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


# The conftest's `broker` on Redis alone: a RedisBroker under the test's own key prefix, on
# this module's clock, its keys deleted afterwards.
pytestmark = pytest.mark.parametrize("backend", ["redis"])


@pytest.fixture
def keys(unique_prefix: str) -> KeySpace:
    return KeySpace(unique_prefix)


def _claimed(broker: RedisBroker, limit: int = 10, types: tuple[str, ...] | None = None) -> list[str]:
    return [lease.task.id for lease in broker.claim(Claim("q", limit, TTL, types=types)).leases]


def test_a_task_of_priority_zero_is_stored_as_before_priorities(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace
) -> None:
    steps.enqueue(broker, [new_task(id="a"), new_task(id="b", priority=0)])
    steps.enqueue(broker, [new_task(id="c")])
    assert client.hget(keys.task("a"), "priority") is None
    assert client.zrange(keys.queue("q"), 0, -1) == [b"a", b"b", b"c"]
    assert client.exists(f"{keys.base}prios:q") == 0


def test_another_priority_has_its_own_sets_listed_while_they_may_hold_tasks(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace
) -> None:
    steps.enqueue(broker, [new_task(id="high", priority=5)])
    assert client.hget(keys.task("high"), "priority") == b"5"
    assert client.zrange(f"{keys.base}pqueue:5:q", 0, -1) == [b"high"]
    assert client.zrange(f"{keys.base}prios:q", 0, -1) == [b"5"]
    assert client.zcard(keys.queue("q")) == 0
    assert _claimed(broker) == ["high"]
    assert _claimed(broker) == []  # the claim that finds the set empty drops it from the list
    assert client.exists(f"{keys.base}prios:q", f"{keys.base}pqueue:5:q") == 0


def test_a_task_stored_before_priorities_is_claimed_as_priority_zero(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace, clock: ManualClock
) -> None:
    steps.enqueue(broker, [new_task(id="old", type="a")])
    client.hdel(keys.task("old"), "priority")  # what an earlier version stored: no such field
    clock.advance(timedelta(seconds=1))
    steps.enqueue(
        broker, [new_task(id="urgent", type="a", priority=1), new_task(id="low", type="a", priority=-1)]
    )
    assert broker.get("old").priority == 0
    assert _claimed(broker, 1, ("a",)) == ["urgent"]
    assert broker.queue_state(QueueQuery("q")).queue_len == 2
    (lease,) = broker.claim(Claim("q", 1, TTL)).leases
    assert (lease.task.id, lease.task.priority) == ("old", 0)
    assert _claimed(broker) == ["low"]
