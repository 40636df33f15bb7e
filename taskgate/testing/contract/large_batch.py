"""Contract: large `enqueue` batches, the size where brokers switch to their bulk paths.

PostgreSQL streams a batch with COPY and Redis writes a batch's index entries once per key;
a small batch takes neither path, so these tests use batches well past those thresholds and
values that need escaping (binary payloads, tabs, newlines and backslashes in strings).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskgate.brokers.base import Broker, NewTask
from taskgate.clock import ManualClock
from taskgate.errors import TaskExistsError
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, new_task, nonzero_counts, submit

__all__ = ["LargeBatchContract"]

BATCH = 60  # past every broker's bulk threshold (PostgreSQL COPY starts at 16 rows)


def _mixed_batch(parent_id: str) -> list[NewTask]:
    """Plain, binary, delayed, keyed, timed and dependent tasks, in an order that mixes them."""
    items: list[NewTask] = []
    for n in range(BATCH):
        fields: dict[str, Any] = {"type": "t\tab" if n % 2 else "plain", "max_retry": n % 4}
        if n % 3 == 0:
            fields["payload"] = bytes([n, 0, 92, 10, 9, 255]) + b"\\N"  # COPY's escapes, raw
        elif n % 3 == 1:
            fields["payload"] = b""
        if n % 5 == 0:
            fields["business_key"] = f"key\\{n}\nline\t{n}"
        if n % 7 == 0:
            fields["delay"] = timedelta(seconds=n)
        if n % 11 == 0:
            fields["depends_on"] = (parent_id,)
        if n % 4 == 1:
            fields["timeout"] = timedelta(milliseconds=250 * n + 1)
        if n % 13 == 5:
            fields["depends_on"] = (items[n - 1].id,)  # a parent earlier in this batch
        items.append(new_task(**fields))
    return items


class LargeBatchContract:
    """A batch of 60 tasks stores, indexes and refuses exactly like a batch of one."""

    def test_a_large_batch_round_trips_every_field(self, broker: Broker, clock: ManualClock) -> None:
        parent = submit(broker)
        items = _mixed_batch(parent.id)
        stored = steps.enqueue(broker, items)
        assert [t.id for t in stored] == [i.id for i in items]
        for item, task in zip(items, stored, strict=True):
            assert broker.get(item.id) == task
            assert (task.type, task.queue, task.payload) == (item.type, item.queue, item.payload)
            assert (task.max_retry, task.business_key) == (item.max_retry, item.business_key)
            assert task.timeout == item.timeout
            assert task.depends_on == item.depends_on
            assert task.run_at == clock.now() + (item.delay or timedelta(0))
            assert task.created_at == clock.now()
            expected = Status.BLOCKED if item.depends_on else Status.PENDING
            assert task.status is expected

    def test_a_large_batch_of_tasks_alike_stores_each_ones_own_id_payload_and_key(
        self, broker: Broker
    ) -> None:
        # What `Gate.submit_many` sends: fields shared but for these three, which brokers may
        # copy from one task's row to the next.
        items = [
            new_task(
                payload=None if n % 4 == 0 else bytes([n, 0, 10]),
                business_key=f"alike-{n}" if n % 3 == 0 else None,
            )
            for n in range(BATCH)
        ]
        steps.enqueue(broker, items)
        for item in items:
            task = broker.get(item.id)
            assert (task.id, task.payload, task.business_key) == (item.id, item.payload, item.business_key)
        assert [t.id for t in steps.history(broker, "alike-3")] == [items[3].id]

    def test_a_large_batch_is_indexed_for_lists_counts_and_claims(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        parent = submit(broker, type="parent", queue="other")
        items = _mixed_batch(parent.id)
        steps.enqueue(broker, items)
        batch_ids = {i.id for i in items}
        blocked = {i.id for i in items if i.depends_on}
        tab_typed = {i.id for i in items if i.type == "t\tab"}
        assert {t.id for t in broker.list(Filter(queue="q"))} == batch_ids
        assert {t.id for t in broker.list(Filter(type="t\tab"))} == tab_typed
        assert {t.id for t in broker.list(Filter(status=Status.BLOCKED))} == blocked
        keyed = [i for i in items if i.business_key is not None]
        assert [t.id for t in steps.history(broker, keyed[-1].business_key or "")] == [keyed[-1].id]
        counts = nonzero_counts(broker)
        assert sum(counts["plain"].values()) + sum(counts["t\tab"].values()) == BATCH
        assert counts["plain"].get(Status.BLOCKED, 0) + counts["t\tab"].get(Status.BLOCKED, 0) == len(blocked)
        due_now = [i.id for i in items if not i.depends_on and not i.delay]
        claimed = steps.claim(broker, "q", BATCH, TTL)
        assert sorted(lease.task.id for lease in claimed) == sorted(due_now)
        clock.advance(BATCH)
        later = {i.id for i in items if not i.depends_on and i.delay}
        assert {lease.task.id for lease in steps.claim(broker, "q", BATCH, TTL)} == later

    def test_a_large_batch_with_one_id_in_use_stores_none_of_it(self, broker: Broker) -> None:
        taken = submit(broker, payload=b"first")
        items = [new_task() for _ in range(BATCH)]
        items[BATCH // 2] = new_task(id=taken.id, payload=b"second")
        with pytest.raises(ValueError, match=taken.id):
            steps.enqueue(broker, items)
        assert broker.list(Filter()) == [taken]
        assert nonzero_counts(broker) == {"t": {Status.PENDING: 1}}

    def test_a_large_batch_with_a_used_business_key_stores_none_of_it(self, broker: Broker) -> None:
        holder = submit(broker, business_key="taken")
        items = [new_task(business_key=f"fresh-{n}") for n in range(BATCH)]
        items[-1] = new_task(business_key="taken")
        with pytest.raises(TaskExistsError) as caught:
            steps.enqueue(broker, items)
        assert caught.value.execution_id == holder.id
        assert broker.list(Filter()) == [holder]
        assert steps.history(broker, "fresh-0") == []
