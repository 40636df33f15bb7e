"""Contract: a task's group (``NewTask.group``) is stored with it and selects it in `list`.

A group is a tenant, a user, any subset of a queue's tasks whose own limits a claim may
apply. Every snapshot of a task -- a submit's, a claim's, a settle's, `get`'s, `list`'s, a
replay's -- carries its group as submitted (None: no group), and ``Filter(group=...)`` lists
the tasks of one group, alone or with the other filters. Bad values are in `BAD_CALLS`.
"""

from __future__ import annotations

from datetime import timedelta

from taskgate.brokers.base import Broker
from taskgate.brokers.params import Submit
from taskgate.ids import new_id
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._support import every_snapshot, new_task, submit

__all__ = ["GroupContract"]

GROUP = "user-42"


class GroupContract:
    """A task's ``group`` round-trips through every snapshot and filters `list`."""

    def test_a_tasks_group_is_in_every_snapshot_of_it(self, broker: Broker) -> None:
        assert {task.group for task in every_snapshot(broker, group=GROUP)} == {GROUP}

    def test_a_task_without_a_group_has_none_in_every_snapshot(self, broker: Broker) -> None:
        assert {task.group for task in every_snapshot(broker, group=None)} == {None}

    def test_each_task_of_a_batch_keeps_its_own_group(self, broker: Broker) -> None:
        groups = [None, "a", "a", "b", None]
        items = [new_task(group=group) for group in groups]
        assert [task.group for task in steps.enqueue(broker, items)] == groups
        assert [broker.get(item.id).group for item in items] == groups

    def test_a_batch_sharing_one_group_stores_it_for_each_task(self, broker: Broker) -> None:
        alike = [new_task(group=GROUP, payload=payload) for payload in (None, b"", b"x")]
        quiet = [new_task(group=GROUP) for _ in range(3)]
        assert {task.group for task in steps.enqueue(broker, alike)} == {GROUP}
        broker.submit(Submit(tuple(quiet), snapshots=False))
        assert {broker.get(item.id).group for item in [*alike, *quiet]} == {GROUP}
        assert {lease.task.group for lease in steps.claim(broker, "q", 6, timedelta(minutes=1))} == {GROUP}

    def test_list_selects_one_group_alone_and_with_other_filters(self, broker: Broker) -> None:
        a1, b1 = submit(broker, group="a"), submit(broker, group="b")
        a2 = submit(broker, group="a", queue="other")
        keyed = submit(broker, group="a", business_key=f"k-{new_id()}")
        submit(broker)
        assert [t.id for t in broker.list(Filter(group="a"))] == [a1.id, a2.id, keyed.id]
        assert [t.id for t in broker.list(Filter(group="b"))] == [b1.id]
        assert [t.id for t in broker.list(Filter(group="a", queue="q"))] == [a1.id, keyed.id]
        assert [t.id for t in broker.list(Filter(group="a", status=Status.PENDING, limit=1, offset=1))] == [
            a2.id
        ]
        assert [t.id for t in broker.list(Filter(group="b", business_key=keyed.business_key))] == []
        assert [t.id for t in broker.list(Filter(group="a", business_key=keyed.business_key))] == [keyed.id]
        assert broker.list(Filter(group="nobody")) == []

    def test_a_replay_copies_the_group_or_its_absence(self, broker: Broker) -> None:
        for group in (GROUP, None):
            old = submit(broker, group=group)
            broker.cancel(old.id)
            new = steps.replay(broker, old.id, new_id=new_id(), payload=b"other")
            assert (new.group, broker.get(new.id).group) == (group, group)
        assert [t.group for t in broker.list(Filter(group=GROUP))] == [GROUP, GROUP]
