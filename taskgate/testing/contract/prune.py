"""Contract: `Broker.prune` -- final tasks deleted by age, never one still needed.

Ages are measured on the broker's clock from ``finished_at``. A parent stays while a child is
still to run, a replayed execution while its replay is stored; a deleted task leaves nothing
behind that a read, a count or a business key could find. Also the traceback a `Retry` or a
`Fail` stores (``last_traceback``), which retention is there to bound.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import Fail, Prune, Retry, Settle
from taskgate.clock import ManualClock
from taskgate.errors import TaskExistsError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    RACE_ROUNDS,
    TTL,
    claim_one,
    new_task,
    nonzero_counts,
    race_pair,
    submit,
)

__all__ = ["PruneContract"]

DAY = timedelta(days=1)
WEEK = timedelta(days=7)
COMPLETED = (Status.COMPLETED,)
FINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELED)


def _completed(broker: Broker, **fields: object) -> Task:
    """A task submitted, claimed and completed now."""
    task = submit(broker, **fields)
    lease = claim_one(broker, queue=task.queue)
    return steps.ack(broker, lease.task.id, lease.token, b"done")


def _failed(broker: Broker, **fields: object) -> Task:
    task = submit(broker, **fields)
    lease = claim_one(broker, queue=task.queue)
    return steps.fail(broker, lease.task.id, lease.token, kind=FailureKind.BUSINESS, error="boom")


def _gone(broker: Broker, task_id: str) -> bool:
    try:
        broker.get(task_id)
    except TaskNotFoundError:
        return True
    return False


class PruneContract:
    """Retention's one verb (issue 36)."""

    def test_old_final_tasks_go_and_young_ones_stay(self, broker: Broker, clock: ManualClock) -> None:
        old = [_completed(broker) for _ in range(3)]
        clock.advance(WEEK)
        young = _completed(broker)
        clock.advance(DAY)

        assert broker.prune(Prune(COMPLETED, older_than=WEEK)) == 3

        assert all(_gone(broker, t.id) for t in old)
        assert broker.get(young.id).status is Status.COMPLETED
        assert [t.id for t in broker.list(Filter())] == [young.id]
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 1}}

    def test_age_counts_from_when_a_task_finished_not_when_it_was_made(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        task = submit(broker)
        clock.advance(WEEK * 2)
        lease = claim_one(broker)
        steps.ack(broker, task.id, lease.token)
        clock.advance(DAY)

        assert broker.prune(Prune(COMPLETED, older_than=WEEK)) == 0
        clock.advance(WEEK)
        assert broker.prune(Prune(COMPLETED, older_than=WEEK)) == 1

    def test_only_the_named_statuses_and_never_a_task_still_to_run(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        done, failed = _completed(broker), _failed(broker)
        canceled = broker.cancel(submit(broker).id)
        pending, running = submit(broker, queue="other"), submit(broker, queue="busy")
        claim_one(broker, queue="busy")
        clock.advance(WEEK)

        assert broker.prune(Prune((Status.FAILED,))) == 1
        assert _gone(broker, failed.id) and not _gone(broker, done.id)
        assert broker.prune(Prune(FINAL)) == 2
        assert _gone(broker, done.id) and _gone(broker, canceled.id)
        assert broker.get(pending.id).status is Status.PENDING
        assert broker.get(running.id).status is Status.RUNNING

    def test_queues_type_and_group_narrow_what_goes(self, broker: Broker, clock: ManualClock) -> None:
        a, b = _completed(broker, queue="a"), _completed(broker, queue="b")
        typed = _completed(broker, queue="a", type="special")
        grouped = _completed(broker, queue="a", group="tenant-1")
        clock.advance(DAY)

        assert broker.prune(Prune(COMPLETED, group="tenant-1")) == 1
        assert broker.prune(Prune(COMPLETED, type="special")) == 1
        assert broker.prune(Prune(COMPLETED, queues=("b",))) == 1
        assert _gone(broker, grouped.id) and _gone(broker, typed.id) and _gone(broker, b.id)
        assert broker.prune(Prune(COMPLETED, exclude_queues=("a",))) == 0
        assert broker.prune(Prune(COMPLETED, queues=("a", "c"))) == 1
        assert _gone(broker, a.id)

    def test_a_prune_deletes_at_most_its_limit_oldest_first(self, broker: Broker, clock: ManualClock) -> None:
        tasks = []
        for _ in range(5):
            tasks.append(_completed(broker))
            clock.advance(1)

        assert broker.prune(Prune(COMPLETED, limit=2)) == 2
        assert [t.id for t in broker.list(Filter())] == [t.id for t in tasks[2:]]
        assert broker.prune(Prune(COMPLETED, limit=2)) == 2
        assert broker.prune(Prune(COMPLETED, limit=2)) == 1
        assert broker.prune(Prune(COMPLETED, limit=2)) == 0

    def test_a_completed_parent_of_a_blocked_child_is_kept_until_the_child_is_final(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        parent = _completed(broker)
        other = submit(broker, queue="slow")
        (child,) = steps.enqueue(broker, [new_task(queue="c", depends_on=(parent.id, other.id))])
        assert child.status is Status.BLOCKED
        clock.advance(WEEK)

        assert broker.prune(Prune(FINAL)) == 0
        assert broker.get(parent.id).status is Status.COMPLETED

        steps.ack(broker, other.id, claim_one(broker, queue="slow").token)
        steps.ack(broker, child.id, claim_one(broker, queue="c").token)
        assert broker.prune(Prune(FINAL)) == 3
        assert all(_gone(broker, t) for t in (parent.id, other.id, child.id))

    def test_a_final_child_keeps_naming_a_pruned_parent_and_a_new_child_of_it_is_refused(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        parent = _failed(broker)
        (child,) = steps.enqueue(broker, [new_task(depends_on=(parent.id,))])
        assert child.status is Status.CANCELED
        clock.advance(DAY)

        assert broker.prune(Prune((Status.FAILED,))) == 1

        assert broker.get(child.id).depends_on == (parent.id,)
        with pytest.raises(TaskNotFoundError):
            steps.enqueue(broker, [new_task(depends_on=(parent.id,))])

    def test_a_business_key_whose_executions_are_all_gone_is_free_again(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        key = f"order-{new_id()}"
        first = _failed(broker, business_key=key)
        again = steps.replay(broker, first.id, new_id=new_id())
        steps.ack(broker, again.id, claim_one(broker).token)
        clock.advance(DAY)

        # A replayed execution stays while its replay is stored; the newest of a chain goes
        # first, and the one it replayed is then the key's newest.
        assert broker.prune(Prune((Status.FAILED,))) == 0
        assert broker.prune(Prune(COMPLETED)) == 1
        assert [t.id for t in steps.history(broker, key)] == [first.id]
        assert broker.prune(Prune((Status.FAILED,))) == 1
        assert steps.history(broker, key) == []

        (reborn,) = steps.enqueue(broker, [new_task(business_key=key)])
        assert [t.id for t in steps.history(broker, key)] == [reborn.id]

    def test_an_execution_left_newest_by_a_prune_can_be_replayed_again(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        first = _failed(broker)
        second = steps.replay(broker, first.id, new_id=new_id())
        steps.fail(broker, second.id, claim_one(broker).token, kind=FailureKind.BUSINESS, error="again")
        clock.advance(DAY)

        assert broker.prune(Prune((Status.FAILED,), limit=1)) == 1
        assert _gone(broker, second.id)
        third = steps.replay(broker, first.id, new_id=new_id())
        assert third.replay_of == first.id

    def test_a_prune_of_nothing_changes_nothing(self, broker: Broker) -> None:
        task = _completed(broker)
        assert broker.prune(Prune(COMPLETED, older_than=DAY)) == 0
        assert broker.get(task.id).status is Status.COMPLETED

    def test_prune_refuses_statuses_that_are_not_final(self, broker: Broker) -> None:
        for status in (Status.PENDING, Status.RUNNING, Status.BLOCKED, Status.RETRYING):
            with pytest.raises(ValueError, match=f"{status.value} is not final"):
                Prune((Status.COMPLETED, status))
        with pytest.raises(ValueError, match="older_than"):
            Prune(COMPLETED, older_than=timedelta(seconds=-1))
        with pytest.raises(ValueError, match="at least one"):
            Prune(())

    def test_a_child_submitted_while_its_parent_is_pruned_either_waits_or_is_refused(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, pruner, submitter = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            parent = _completed(main)
            clock.advance(DAY)
            child = new_task(queue="children", depends_on=(parent.id,))
            pruned, submitted = race_pair(
                partial(pruner.prune, Prune(COMPLETED, older_than=DAY)),
                partial(steps.enqueue, submitter, [child]),
            )
            assert pruned.ok, pruned.error
            if submitted.ok:  # the child is stored, pending: its parent was kept, or pruned after
                assert main.get(child.id).status is Status.PENDING
                steps.ack(main, child.id, claim_one(main, queue="children").token)
            else:
                assert isinstance(submitted.error, TaskNotFoundError), submitted.error
                assert _gone(main, parent.id) and _gone(main, child.id)
            main.prune(Prune(COMPLETED))
            assert main.list(Filter()) == []

    def test_a_replay_racing_a_prune_of_its_execution_has_one_winner(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, pruner, replayer = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            old = _failed(main)
            clock.advance(DAY)
            new = new_id()
            pruned, replayed = race_pair(
                partial(pruner.prune, Prune((Status.FAILED,))),
                partial(steps.replay, replayer, old.id, new_id=new),
            )
            assert pruned.ok, pruned.error
            if replayed.ok:  # replayed first: the old execution is kept, or went after the new did
                assert main.get(new).replay_of == old.id
                assert main.get(old.id).status is Status.FAILED
                main.cancel(new)
            else:
                assert isinstance(replayed.error, TaskNotFoundError), replayed.error
                assert pruned.value == 1 and _gone(main, old.id) and _gone(main, new)
            while main.prune(Prune(FINAL)):
                pass
            assert main.list(Filter()) == []

    def test_a_child_finishing_while_its_parent_is_pruned_leaves_both_consistent(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, pruner, worker = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            parent = _completed(main)
            (child,) = steps.enqueue(main, [new_task(queue="children", depends_on=(parent.id,))])
            lease = claim_one(main, queue="children")
            clock.advance(DAY)
            pruned, acked = race_pair(
                partial(pruner.prune, Prune(COMPLETED, older_than=DAY)),
                partial(steps.ack, worker, child.id, lease.token, b"r"),
            )
            assert pruned.ok, pruned.error
            assert acked.ok, acked.error
            assert main.get(child.id).status is Status.COMPLETED
            assert pruned.value == 0 or _gone(main, parent.id)  # kept while the child ran
            while main.prune(Prune(COMPLETED)):
                pass
            assert main.list(Filter()) == []

    def test_a_submit_of_a_business_key_racing_the_prune_of_its_last_execution_has_one_winner(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, pruner, submitter = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            key = f"k-{new_id()}"
            old = _completed(main, business_key=key)
            clock.advance(DAY)
            new = new_task(queue="fresh", business_key=key)
            pruned, submitted = race_pair(
                partial(pruner.prune, Prune(COMPLETED, older_than=DAY)),
                partial(steps.enqueue, submitter, [new]),
            )
            assert pruned.ok, pruned.error
            assert _gone(main, old.id)
            if submitted.ok:  # the prune went first: the key was free
                assert [t.id for t in steps.history(main, key)] == [new.id]
                main.cancel(new.id)
                main.prune(Prune((Status.CANCELED,)))
            else:  # the submit went first, and found the key taken
                assert isinstance(submitted.error, TaskExistsError), submitted.error
            assert steps.history(main, key) == []

    def test_a_retry_and_a_fail_store_their_traceback(self, broker: Broker) -> None:
        submit(broker)
        lease = claim_one(broker)
        tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in handler\nValueError: boom\n'
        (retried,) = broker.settle(
            Settle((Retry(lease.task.id, lease.token, FailureKind.BUSINESS, "e", traceback=tb),))
        )
        assert isinstance(retried, Task) and retried.last_traceback == tb
        assert broker.get(lease.task.id).last_traceback == tb

        again = claim_one(broker, ttl=TTL)
        assert again.task.last_traceback == tb
        (failed,) = broker.settle(
            Settle((Fail(again.task.id, again.token, FailureKind.SKIP, "e", traceback=None),))
        )
        assert isinstance(failed, Task) and failed.last_traceback is None
        assert broker.get(again.task.id).last_traceback is None

    def test_a_traceback_is_stored_as_its_newest_eight_kib(self, broker: Broker) -> None:
        submit(broker)
        lease = claim_one(broker)
        tb = (
            "Traceback (most recent call last):\n"
            + "  frame \u00e9\n" * 2000
            + "ValueError: newest\x00\udcff\n"
        )
        steps.settle_one(broker, Fail(lease.task.id, lease.token, FailureKind.BUSINESS, "e", traceback=tb))
        stored = broker.get(lease.task.id).last_traceback
        assert stored is not None and len(stored.encode("utf-8")) <= 8192
        assert stored.endswith("ValueError: newest\\x00\\udcff\n")
