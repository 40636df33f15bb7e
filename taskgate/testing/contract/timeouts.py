"""Contract: a task's own run-time limit (``NewTask.timeout``) is stored with the task.

Whichever process claims the task cancels its run past that limit, so every snapshot of it --
a submit's, `get`'s, `list`'s, a claim's, a settle's, a replay's -- carries the limit as
submitted; a task without one has None there (its queue's limit applies). The runtime's use
of it is tested end to end in ``tests/integration``; bad values are in `BAD_CALLS`.
"""

from __future__ import annotations

from datetime import timedelta

from taskgate.brokers.base import MAX_DELAY, Broker
from taskgate.brokers.params import Submit
from taskgate.ids import new_id
from taskgate.testing import steps
from taskgate.testing.contract._support import every_snapshot, new_task, submit

__all__ = ["TimeoutContract"]

TIMEOUT = timedelta(seconds=1, milliseconds=500)


class TimeoutContract:
    """A task's ``timeout`` round-trips through every snapshot; None stays None."""

    def test_a_tasks_timeout_is_in_every_snapshot_of_it(self, broker: Broker) -> None:
        assert {task.timeout for task in every_snapshot(broker, timeout=TIMEOUT)} == {TIMEOUT}

    def test_a_task_without_a_timeout_has_none_in_every_snapshot(self, broker: Broker) -> None:
        assert {task.timeout for task in every_snapshot(broker, timeout=None)} == {None}

    def test_each_task_of_a_batch_keeps_its_own_timeout(self, broker: Broker) -> None:
        timeouts = [None, TIMEOUT, TIMEOUT, timedelta(minutes=5), None]
        items = [new_task(timeout=timeout) for timeout in timeouts]
        assert [task.timeout for task in steps.enqueue(broker, items)] == timeouts
        assert [broker.get(item.id).timeout for item in items] == timeouts

    def test_a_batch_sharing_one_timeout_stores_it_for_each_task(self, broker: Broker) -> None:
        alike = [new_task(timeout=TIMEOUT, payload=payload) for payload in (None, b"", b"x")]
        quiet = [new_task(timeout=TIMEOUT) for _ in range(3)]
        assert {task.timeout for task in steps.enqueue(broker, alike)} == {TIMEOUT}
        broker.submit(Submit(tuple(quiet), snapshots=False))
        assert {broker.get(item.id).timeout for item in [*alike, *quiet]} == {TIMEOUT}
        assert {lease.task.timeout for lease in steps.claim(broker, "q", 6, TIMEOUT)} == {TIMEOUT}

    def test_a_timeout_is_kept_to_the_millisecond_up_to_the_longest(self, broker: Broker) -> None:
        # NewTask rounds a finer timeout up to whole milliseconds, the unit every backend keeps.
        finest, longest = submit(broker, timeout=timedelta(microseconds=1)), submit(broker, timeout=MAX_DELAY)
        assert (finest.timeout, longest.timeout) == (timedelta(milliseconds=1), MAX_DELAY)
        assert (broker.get(finest.id).timeout, broker.get(longest.id).timeout) == (finest.timeout, MAX_DELAY)

    def test_a_replay_copies_the_timeout_or_its_absence(self, broker: Broker) -> None:
        for timeout in (TIMEOUT, None):
            old = submit(broker, timeout=timeout)
            broker.cancel(old.id)
            new = steps.replay(broker, old.id, new_id=new_id(), payload=b"other")
            assert (new.timeout, broker.get(new.id).timeout) == (timeout, timeout)
