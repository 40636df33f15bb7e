"""Back-pressure on Redis with data an earlier build stored: blocked tasks it stored are not in
``blocked:<queue>``, so they do not count until they are ready; then they count as pending.
Nothing breaks when such a task leaves blocked (a removal of a member not there changes nothing).
"""

from __future__ import annotations

import pytest
import redis

from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Submit
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.errors import QueueFullError
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import claim_one, new_task

# The conftest's `broker` on Redis alone: a RedisBroker under the test's own key prefix, on
# this module's clock, its keys deleted afterwards.
pytestmark = pytest.mark.parametrize("backend", ["redis"])


def _limited(broker: RedisBroker, task: NewTask, limit: int) -> Status:
    (status,) = broker.submit(Submit((task,), max_pending=(("q", limit),))).statuses
    return status


def test_blocked_tasks_are_kept_in_their_queues_blocked_set_until_they_leave_it(
    broker: RedisBroker, client: redis.Redis, unique_prefix: str
) -> None:
    keys = KeySpace(unique_prefix)
    parent = steps.enqueue(broker, [new_task(queue="parents")])[0]
    child = new_task(depends_on=(parent.id,))
    steps.enqueue(broker, [child])
    assert client.zrange(f"{keys.base}blocked:q", 0, -1) == [child.id.encode()]
    lease = claim_one(broker, "parents")
    steps.ack(broker, parent.id, lease.token, None)
    assert broker.get(child.id).status is Status.PENDING
    assert client.exists(f"{keys.base}blocked:q") == 0


def test_a_task_an_earlier_build_stored_blocked_counts_once_it_is_ready(
    broker: RedisBroker, client: redis.Redis, unique_prefix: str
) -> None:
    keys = KeySpace(unique_prefix)
    parent = steps.enqueue(broker, [new_task(queue="parents")])[0]
    old = new_task(depends_on=(parent.id,))
    steps.enqueue(broker, [old])
    client.delete(f"{keys.base}blocked:q")  # stored by a build without the blocked sets
    assert _limited(broker, new_task(), 2) is Status.PENDING  # the old blocked task is not counted
    lease = claim_one(broker, "parents")
    steps.ack(broker, parent.id, lease.token, None)  # wakes it: removing it from the set is a no-op
    assert broker.get(old.id).status is Status.PENDING
    with pytest.raises(QueueFullError) as raised:
        _limited(broker, new_task(), 2)
    assert raised.value.waiting == 2  # now pending: counted
    assert client.exists(f"{keys.base}blocked:q") == 0
