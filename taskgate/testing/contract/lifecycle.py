"""Contract: a task's life from enqueue to a final state, one transition per test."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.checks import MAX_ERROR_LENGTH
from taskgate.clock import ManualClock
from taskgate.errors import TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, new_task, submit

__all__ = ["LifecycleContract"]


class LifecycleContract:
    """Enqueue, get, ack, fail, retry, requeue and delayed tasks (seed: RoundTrip, AckFail, …)."""

    def test_enqueued_task_round_trips_every_field(self, broker: Broker, clock: ManualClock) -> None:
        parent = submit(broker)
        item = new_task(
            type="email",
            queue="mail",
            payload=b"\x00\xff binary",
            max_retry=4,
            business_key="order-1",
            depends_on=(parent.id,),
            ignore_parent_failure=True,
            timeout=timedelta(seconds=90),
        )
        (stored,) = steps.enqueue(broker, [item])
        got = broker.get(item.id)
        assert got == stored
        assert (got.id, got.type, got.queue, got.payload) == (item.id, "email", "mail", b"\x00\xff binary")
        assert (got.max_retry, got.business_key, got.depends_on) == (4, "order-1", (parent.id,))
        assert (got.ignore_parent_failure, got.timeout) == (True, timedelta(seconds=90))
        assert (got.attempts, got.throttled, got.lease_lost, got.claims) == (0, 0, 0, 0)
        assert (got.created_at, got.run_at) == (clock.now(), clock.now())
        assert (got.result, got.last_error, got.replay_of) == (None, None, None)
        assert (got.started_at, got.finished_at) == (None, None)

    def test_every_snapshot_holds_exactly_the_task_fields(self, broker: Broker) -> None:
        parent = submit(broker, business_key="fields")
        (child,) = steps.enqueue(broker, [new_task(depends_on=(parent.id,))])
        lease = claim_one(broker)
        (acked,) = steps.ack_many(broker, [(lease.task.id, lease.token, b"1")])
        assert isinstance(acked, Task)
        snapshots = [parent, child, lease.task, acked, broker.get(child.id), *broker.list(Filter())]
        snapshots += steps.history(broker, "fields")
        for snapshot in snapshots:
            assert {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(Task)} == vars(snapshot)

    def test_none_payload_stays_none(self, broker: Broker) -> None:
        task = submit(broker, payload=None)
        assert broker.get(task.id).payload is None

    def test_empty_payload_stays_empty_bytes(self, broker: Broker) -> None:
        task = submit(broker, payload=b"")
        assert broker.get(task.id).payload == b""

    def test_enqueue_returns_snapshots_in_batch_order(self, broker: Broker) -> None:
        items = [new_task(id=f"task-{n}") for n in (3, 1, 2)]
        assert [t.id for t in steps.enqueue(broker, items)] == ["task-3", "task-1", "task-2"]

    def test_enqueue_of_an_empty_batch_returns_nothing(self, broker: Broker) -> None:
        assert steps.enqueue(broker, []) == []

    def test_enqueue_is_all_or_nothing(self, broker: Broker) -> None:
        good = new_task()
        with pytest.raises(TaskNotFoundError):
            steps.enqueue(broker, [good, new_task(depends_on=(new_id(),))])
        with pytest.raises(TaskNotFoundError):
            broker.get(good.id)

    def test_enqueue_of_an_id_in_use_raises_value_error_and_changes_nothing(self, broker: Broker) -> None:
        first = submit(broker, payload=b"first")
        with pytest.raises(ValueError):
            steps.enqueue(broker, [new_task(id=first.id, payload=b"second")])
        assert broker.get(first.id) == first

    def test_get_of_an_unknown_id_raises_task_not_found(self, broker: Broker) -> None:
        with pytest.raises(TaskNotFoundError):
            broker.get(new_id())

    def test_delayed_task_is_not_claimable_before_run_at(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker, delay=timedelta(seconds=10))
        assert task.run_at == clock.now() + timedelta(seconds=10)
        assert steps.claim(broker, "q", 1, TTL) == []
        clock.advance(9)
        assert steps.claim(broker, "q", 1, TTL) == []
        clock.advance(1)
        assert claim_one(broker).task.id == task.id

    def test_run_at_wins_over_delay(self, broker: Broker, clock: ManualClock) -> None:
        when = clock.now() + timedelta(seconds=5)
        task = submit(broker, run_at=when, delay=timedelta(hours=1))
        assert task.run_at == when
        clock.advance(5)
        assert claim_one(broker).task.id == task.id

    def test_run_at_in_the_past_is_due_at_once(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker, run_at=clock.now() - timedelta(days=1))
        assert claim_one(broker).task.id == task.id

    def test_ack_completes_the_task_with_its_result(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        clock.advance(2)
        done = steps.ack(broker, task.id, lease.token, b'{"answer":42}')
        assert done.status is Status.COMPLETED
        assert done.result == b'{"answer":42}'
        assert done.finished_at == clock.now()
        assert broker.get(task.id) == done

    def test_ack_with_none_result_stores_none(self, broker: Broker) -> None:
        task = submit(broker)
        done = steps.ack(broker, task.id, claim_one(broker).token, None)
        assert (done.status, done.result) == (Status.COMPLETED, None)

    def test_fail_with_a_business_error_counts_an_attempt(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        failed = steps.fail(broker, task.id, claim_one(broker).token, kind=FailureKind.BUSINESS, error="boom")
        assert (failed.status, failed.attempts, failed.throttled) == (Status.FAILED, 1, 0)
        assert (failed.last_error, failed.finished_at) == ("boom", clock.now())
        assert broker.get(task.id) == failed

    def test_fail_with_skip_counts_an_attempt(self, broker: Broker) -> None:
        task = submit(broker)
        failed = steps.fail(broker, task.id, claim_one(broker).token, kind=FailureKind.SKIP, error="hopeless")
        assert (failed.status, failed.attempts, failed.throttled) == (Status.FAILED, 1, 0)

    def test_fail_when_throttled_counts_a_throttle_not_an_attempt(self, broker: Broker) -> None:
        task = submit(broker)
        failed = steps.fail(
            broker, task.id, claim_one(broker).token, kind=FailureKind.THROTTLED, error="busy"
        )
        assert (failed.status, failed.attempts, failed.throttled) == (Status.FAILED, 0, 1)

    @pytest.mark.parametrize(
        ("error", "stored"),
        [
            ("nul\x00byte", "nul\\x00byte"),  # PostgreSQL's text cannot hold NUL
            ("file \udcff.txt", "file \\udcff.txt"),  # a lone surrogate (os.fsdecode)
            ("\U0001f600 four bytes", "\U0001f600 four bytes"),  # beyond MySQL's 3-byte utf8
        ],
        ids=["nul", "surrogate", "astral"],
    )
    @pytest.mark.parametrize("verb", ["fail", "retry"])
    def test_fail_and_retry_store_any_error_text_readably(
        self, broker: Broker, verb: str, error: str, stored: str
    ) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        if verb == "fail":
            written = steps.fail(broker, task.id, lease.token, kind=FailureKind.SKIP, error=error)
        else:
            written = steps.retry(
                broker, task.id, lease.token, kind=FailureKind.BUSINESS, error=error, delay=TTL
            )
        assert (written.attempts, written.last_error) == (1, stored)
        assert broker.get(task.id) == written
        assert broker.list(Filter()) == [written]

    def test_an_enormous_error_text_is_stored_cut_to_the_maximum(self, broker: Broker) -> None:
        task = submit(broker)
        failed = steps.fail(
            broker, task.id, claim_one(broker).token, kind=FailureKind.BUSINESS, error="e" * 1_000_000
        )
        assert failed.last_error is not None and len(failed.last_error) == MAX_ERROR_LENGTH
        assert failed.last_error.startswith("eee") and "cut from 1000000 characters" in failed.last_error
        assert broker.get(task.id) == failed

    def test_retry_sets_retrying_due_after_the_delay(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        retried = steps.retry(
            broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="flaky", delay=timedelta(seconds=8)
        )
        assert (retried.status, retried.attempts, retried.throttled) == (Status.RETRYING, 1, 0)
        assert (retried.run_at, retried.last_error) == (clock.now() + timedelta(seconds=8), "flaky")
        assert retried.finished_at is None
        assert broker.get(task.id) == retried

    def test_throttled_retry_counts_a_throttle_not_an_attempt(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        retried = steps.retry(
            broker, task.id, lease.token, kind=FailureKind.THROTTLED, error="429", delay=TTL
        )
        assert (retried.status, retried.attempts, retried.throttled) == (Status.RETRYING, 0, 1)

    def test_retrying_task_is_claimed_again_once_due(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        first = claim_one(broker)
        steps.retry(
            broker, task.id, first.token, kind=FailureKind.BUSINESS, error="x", delay=timedelta(seconds=4)
        )
        clock.advance(3)
        assert steps.claim(broker, "q", 1, TTL) == []
        clock.advance(1)
        second = claim_one(broker)
        assert second.task.id == task.id
        assert (second.task.status, second.task.claims, second.task.attempts) == (Status.RUNNING, 2, 1)
        assert second.task.started_at == clock.now()
        assert second.token != first.token

    def test_requeue_puts_the_task_back_without_counting(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        clock.advance(5)
        back = steps.requeue(broker, task.id, lease.token)
        assert back.status is Status.PENDING
        assert (back.attempts, back.throttled, back.lease_lost, back.claims) == (0, 0, 0, 1)
        assert back.run_at == clock.now()
        assert back.finished_at is None
        again = claim_one(broker)
        assert (again.task.id, again.task.claims, again.task.attempts) == (task.id, 2, 0)

    def test_claims_counts_every_claim(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        for expected in (1, 2, 3):
            lease = claim_one(broker)
            assert lease.task.claims == expected
            steps.requeue(broker, task.id, lease.token)
        assert broker.get(task.id).claims == 3
