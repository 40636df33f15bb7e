"""Redis: a claim of some types reads each type's due set (``due:<n>:<queue>:<type>``), checked
against ``queue:<queue>`` -- so it stays right beside a build that keeps only the queue's set
(a rolling deploy from one), which stores, leases and re-queues tasks there alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from taskgate.brokers.params import Claim, QueueQuery, Unhandled
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


def _typed(broker: RedisBroker, *types: str) -> list[str]:
    return [lease.task.id for lease in broker.claim(Claim("q", 5, TTL, types=types)).leases]


def _due_key(keys: KeySpace, queue: str, task_type: str) -> str:
    return f"{keys.base}due:{len(queue)}:{queue}:{task_type}"


def test_each_type_of_a_queue_has_its_own_due_set(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace
) -> None:
    steps.enqueue(broker, [new_task(id="a1", type="a"), new_task(id="b1", type="b")])
    assert client.zrange(_due_key(keys, "q", "a"), 0, -1) == [b"a1"]
    assert client.smembers(f"{keys.base}types:q") == {b"a", b"b"}
    assert _typed(broker, "b") == ["b1"]
    assert client.zcard(_due_key(keys, "q", "b")) == 0  # leased: out of its due set with its queue's


def test_a_task_an_earlier_build_leased_is_not_leased_again(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace
) -> None:
    steps.enqueue(broker, [new_task(id="x", type="a")])
    client.zrem(queue_key := f"{keys.base}queue:q", "x")  # what that build's claim removes
    assert client.zcard(queue_key) == 0
    assert _typed(broker, "a") == []
    assert client.zcard(_due_key(keys, "q", "a")) == 0  # the stale entry is gone


def test_a_task_an_earlier_build_requeued_for_later_waits_for_its_new_time(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace, clock: ManualClock
) -> None:
    steps.enqueue(broker, [new_task(id="x", type="a")])
    later = int((clock.now() + timedelta(minutes=1)).timestamp() * 1_000_000)
    client.zadd(f"{keys.base}queue:q", {"x": later})
    assert _typed(broker, "a") == []
    clock.advance(timedelta(minutes=1))
    assert _typed(broker, "a") == ["x"]


def test_a_task_an_earlier_build_stored_in_the_queue_alone_is_found(
    broker: RedisBroker, client: redis.Redis, keys: KeySpace, clock: ManualClock
) -> None:
    steps.enqueue(broker, [new_task(id="old", type="a"), new_task(id="other", type="b")])
    client.zrem(_due_key(keys, "q", "a"), "old")  # stored by a build without the due sets
    client.srem(f"{keys.base}types:q", "a")
    assert _typed(broker, "a") == ["old"]
    clock.advance(timedelta(minutes=5))
    unhandled = broker.queue_state(QueueQuery("q", unhandled=Unhandled(timedelta(minutes=1)))).unhandled
    assert unhandled == 1  # "other", whose type the repair kept
