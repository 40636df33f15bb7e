"""Contract: replay -- a new execution of a final one, checked and created in one unit."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import Replay
from taskgate.clock import ManualClock
from taskgate.errors import (
    AlreadyReplayedError,
    CompletedNotAllowedError,
    ReplayNotFinalError,
    TaskNotFoundError,
)
from taskgate.ids import new_id
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import claim_one, new_task, stored_state, submit

__all__ = ["ReplayContract", "ReplayDescendantsContract"]

MINUTE = timedelta(minutes=1)


def _failed(broker: Broker, **fields: object) -> Task:
    task = submit(broker, **fields)
    lease = claim_one(broker, str(fields.get("queue", "q")))
    return steps.fail(broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="boom")


class ReplayContract:
    """Replays and chains (seed: ReplayBasic, ReplayChain)."""

    def test_replay_creates_a_fresh_execution_pointing_at_the_old_one(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        old = _failed(broker, payload=b"p", max_retry=3, business_key="bk", type="ty", timeout=MINUTE)
        clock.advance(10)
        new = steps.replay(broker, old.id, new_id="replay-1")
        assert (new.id, new.replay_of, new.status) == ("replay-1", old.id, Status.PENDING)
        assert (new.type, new.queue, new.payload, new.max_retry, new.timeout) == ("ty", "q", b"p", 3, MINUTE)
        assert (new.business_key, new.depends_on) == ("bk", ())
        assert (new.attempts, new.throttled, new.lease_lost, new.claims) == (0, 0, 0, 0)
        assert (new.result, new.last_error, new.started_at, new.finished_at) == (None, None, None, None)
        assert (new.created_at, new.run_at) == (clock.now(), clock.now())
        assert broker.get(new.id) == new

    def test_replay_never_changes_the_old_record(self, broker: Broker) -> None:
        old = _failed(broker)
        steps.replay(broker, old.id, new_id=new_id())
        assert broker.get(old.id) == old

    def test_replayed_execution_can_be_claimed(self, broker: Broker) -> None:
        old = _failed(broker)
        new = steps.replay(broker, old.id, new_id=new_id())
        assert claim_one(broker).task.id == new.id

    def test_replay_with_a_new_payload_uses_it(self, broker: Broker) -> None:
        old = _failed(broker, payload=b"old")
        assert steps.replay(broker, old.id, new_id=new_id(), payload=b"new").payload == b"new"

    def test_replay_with_payload_none_clears_it(self, broker: Broker) -> None:
        old = _failed(broker, payload=b"old")
        assert steps.replay(broker, old.id, new_id=new_id(), payload=None).payload is None

    def test_replay_of_a_canceled_execution_is_allowed(self, broker: Broker) -> None:
        old = broker.cancel(submit(broker).id)
        assert steps.replay(broker, old.id, new_id=new_id()).status is Status.PENDING

    def test_replay_of_a_pending_execution_raises_not_final(self, broker: Broker) -> None:
        old = submit(broker)
        with pytest.raises(ReplayNotFinalError):
            steps.replay(broker, old.id, new_id=new_id())
        assert broker.list(Filter()) == [old]

    def test_replay_of_a_running_execution_raises_not_final(self, broker: Broker) -> None:
        old = submit(broker)
        claim_one(broker)
        with pytest.raises(ReplayNotFinalError):
            steps.replay(broker, old.id, new_id=new_id())
        assert len(broker.list(Filter())) == 1

    def test_replay_of_a_completed_execution_needs_allow_completed(self, broker: Broker) -> None:
        old = submit(broker)
        steps.ack(broker, old.id, claim_one(broker).token, b"r")
        with pytest.raises(CompletedNotAllowedError):
            steps.replay(broker, old.id, new_id=new_id())
        assert len(broker.list(Filter())) == 1
        assert steps.replay(broker, old.id, new_id=new_id(), allow_completed=True).replay_of == old.id

    def test_replay_of_an_unknown_execution_raises_task_not_found(self, broker: Broker) -> None:
        with pytest.raises(TaskNotFoundError):
            steps.replay(broker, new_id(), new_id=new_id())

    def test_replay_of_an_id_in_use_raises_value_error(self, broker: Broker) -> None:
        old = _failed(broker)
        other = submit(broker)
        with pytest.raises(ValueError):
            steps.replay(broker, old.id, new_id=other.id)
        assert len(broker.list(Filter())) == 2

    def test_only_the_newest_execution_of_a_chain_can_be_replayed(self, broker: Broker) -> None:
        first = _failed(broker)
        second = steps.replay(broker, first.id, new_id=new_id())
        with pytest.raises(AlreadyReplayedError):
            steps.replay(broker, first.id, new_id=new_id())
        steps.fail(broker, second.id, claim_one(broker).token, kind=FailureKind.SKIP, error="x")
        third = steps.replay(broker, second.id, new_id=new_id())
        assert third.replay_of == second.id
        with pytest.raises(AlreadyReplayedError):
            steps.replay(broker, second.id, new_id=new_id())

    def test_already_replayed_is_checked_before_completed_not_allowed(self, broker: Broker) -> None:
        first = submit(broker)
        steps.ack(broker, first.id, claim_one(broker).token, None)
        steps.replay(broker, first.id, new_id=new_id(), allow_completed=True)
        with pytest.raises(AlreadyReplayedError):
            steps.replay(broker, first.id, new_id=new_id())

    def test_replay_status_follows_the_enqueue_rule(self, broker: Broker) -> None:
        parent = _failed(broker, queue="parents")
        child = submit(broker, depends_on=(parent.id,))
        assert child.status is Status.CANCELED
        assert steps.replay(broker, child.id, new_id=new_id()).status is Status.CANCELED
        tolerant = submit(broker, depends_on=(parent.id,), ignore_parent_failure=True, queue="t")
        broker.cancel(tolerant.id)
        assert steps.replay(broker, tolerant.id, new_id=new_id()).status is Status.PENDING

    def test_replay_of_a_child_whose_parent_was_replayed_waits_on_the_original_parent(
        self, broker: Broker
    ) -> None:
        parent = submit(broker, queue="parents")
        child = submit(broker, depends_on=(parent.id,))
        broker.cancel(parent.id)
        assert broker.get(child.id).status is Status.CANCELED
        new_child = steps.replay(broker, child.id, new_id=new_id())
        assert (new_child.depends_on, new_child.status) == ((parent.id,), Status.CANCELED)


def _failed_pipeline(broker: Broker, *stages: tuple[str, tuple[str, ...]]) -> dict[str, Task]:
    """Stages (id, the ids it depends on) in submit order; the first fails, which cancels every
    stage depending on it. Snapshots by id, as stored after the failure."""
    steps.enqueue(broker, [new_task(id=task_id, depends_on=parents) for task_id, parents in stages])
    (lease,) = steps.claim(broker, "q", 1, MINUTE)
    steps.fail(broker, lease.task.id, lease.token, kind=FailureKind.BUSINESS, error="boom")
    return {task_id: broker.get(task_id) for task_id, _ in stages}


def _replay_pipeline(broker: Broker, root: str, *descendants: str) -> Task:
    pairs = tuple((old_id, f"{old_id}-2") for old_id in descendants)
    return broker.replay(Replay(root, f"{root}-2", descendants=pairs))


class ReplayDescendantsContract:
    """`Replay.descendants`: a failed pipeline's canceled stages re-run with the stage that
    failed, in one unit, each new stage depending on the new executions of its parents."""

    def test_a_chain_is_re_run_each_stage_waiting_for_the_new_one_before_it(self, broker: Broker) -> None:
        old = _failed_pipeline(broker, ("a", ()), ("b", ("a",)), ("c", ("b",)))
        assert [old[x].status for x in "abc"] == [Status.FAILED, Status.CANCELED, Status.CANCELED]
        first = _replay_pipeline(broker, "a", "b", "c")
        assert (first.id, first.status, first.replay_of) == ("a-2", Status.PENDING, "a")
        b2, c2 = broker.get("b-2"), broker.get("c-2")
        assert (b2.status, b2.depends_on, b2.replay_of) == (Status.BLOCKED, ("a-2",), "b")
        assert (c2.status, c2.depends_on, c2.replay_of) == (Status.BLOCKED, ("b-2",), "c")
        assert [broker.get(x) for x in "abc"] == [old[x] for x in "abc"]  # the old runs stay as they were
        for stage in ("a-2", "b-2", "c-2"):  # the new pipeline runs stage by stage
            (lease,) = steps.claim(broker, "q", 10, MINUTE)
            assert lease.task.id == stage
            steps.ack(broker, lease.task.id, lease.token)
        assert broker.get("c-2").status is Status.COMPLETED

    def test_a_diamond_joins_the_new_executions_and_keeps_parents_not_re_run(self, broker: Broker) -> None:
        done = submit(broker, id="done")
        (lease,) = steps.claim(broker, "q", 1, MINUTE)
        steps.ack(broker, lease.task.id, lease.token)
        _failed_pipeline(broker, ("a", ()), ("b", ("a",)), ("c", ("a", "done")), ("d", ("b", "c")))
        _replay_pipeline(broker, "a", "b", "c", "d")
        assert broker.get("c-2").depends_on == ("a-2", done.id)
        assert broker.get("d-2").depends_on == ("b-2", "c-2")
        assert [t.id for t in broker.list(Filter(status=Status.BLOCKED))] == ["b-2", "c-2", "d-2"]

    def test_a_descendant_that_cannot_be_replayed_leaves_everything_as_it_was(self, broker: Broker) -> None:
        _failed_pipeline(broker, ("a", ()), ("b", ("a",)), ("c", ("b",)))
        steps.replay(broker, "c", new_id="c-again")  # c already has a newer execution
        before = stored_state(broker)
        with pytest.raises(AlreadyReplayedError, match="c-again"):
            _replay_pipeline(broker, "a", "b", "c")
        with pytest.raises(ValueError, match="before a parent"):
            broker.replay(Replay("a", "a-2", descendants=(("c-again", "c-3"), ("b", "b-2"))))
        assert stored_state(broker) == before
