"""Contract: claiming (order, limit, mutual exclusion) and waiting for work."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.clock import ManualClock
from taskgate.errors import BrokerError
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import TTL, claim_one, new_task, race, submit

__all__ = ["ClaimContract", "WaitContract"]

# A wait that must be cut short uses this timeout; ending within WOKEN_WITHIN proves it was.
LONG_WAIT = 20.0
WOKEN_WITHIN = 10.0
TINY_WAIT = 0.05
HEAD_START = 0.05


class ClaimContract:
    """Which tasks a claim returns, and to whom (seed: ClaimMutex)."""

    def test_claim_leases_the_task_until_now_plus_ttl(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        (lease,) = steps.claim(broker, "q", 5, TTL)
        assert lease.task.id == task.id
        assert (lease.task.status, lease.task.claims) == (Status.RUNNING, 1)
        assert lease.task.started_at == clock.now()
        assert lease.expires_at == clock.now() + TTL
        assert isinstance(lease.token, str) and lease.token
        assert broker.get(task.id) == lease.task

    def test_claim_takes_the_oldest_due_first(self, broker: Broker, clock: ManualClock) -> None:
        late = submit(broker, delay=timedelta(seconds=2))
        early = submit(broker, delay=timedelta(seconds=1))
        now = submit(broker)
        clock.advance(5)
        assert [lease.task.id for lease in steps.claim(broker, "q", 3, TTL)] == [now.id, early.id, late.id]

    def test_claim_breaks_run_at_ties_by_id(self, broker: Broker) -> None:
        steps.enqueue(broker, [new_task(id=i) for i in ("b-task", "c-task", "a-task")])
        assert [lease.task.id for lease in steps.claim(broker, "q", 3, TTL)] == ["a-task", "b-task", "c-task"]

    def test_claim_never_returns_more_than_its_limit(self, broker: Broker) -> None:
        steps.enqueue(broker, [new_task() for _ in range(5)])
        assert len(steps.claim(broker, "q", 2, TTL)) == 2
        assert len(steps.claim(broker, "q", 10, TTL)) == 3
        assert steps.claim(broker, "q", 10, TTL) == []

    def test_claim_takes_only_its_own_queue(self, broker: Broker) -> None:
        other = submit(broker, queue="other")
        assert steps.claim(broker, "q", 5, TTL) == []
        assert claim_one(broker, "other").task.id == other.id

    def test_claim_of_a_queue_differing_only_by_trailing_spaces_takes_only_its_own(
        self, broker: Broker
    ) -> None:
        # Names compare exactly: a PAD SPACE collation (MySQL's utf8mb4_bin) took 'jobs ' for 'jobs'.
        plain = submit(broker, queue="jobs")
        assert steps.claim(broker, "jobs ", 5, TTL) == []
        assert steps.queue_length(broker, "jobs ") == 0
        padded = submit(broker, queue="jobs ")
        assert [lease.task.id for lease in steps.claim(broker, "jobs ", 5, TTL)] == [padded.id]
        assert [lease.task.id for lease in steps.claim(broker, "jobs", 5, TTL)] == [plain.id]

    def test_claim_skips_blocked_tasks(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        submit(broker, depends_on=(parent.id,))
        assert steps.claim(broker, "q", 5, TTL) == []

    def test_claim_skips_finished_and_canceled_tasks(self, broker: Broker) -> None:
        done = submit(broker)
        steps.ack(broker, done.id, claim_one(broker).token, None)
        broker.cancel(submit(broker).id)
        assert steps.claim(broker, "q", 5, TTL) == []

    def test_a_leased_task_is_not_claimed_again(self, broker_factory: BrokerFactory) -> None:
        first, second = broker_factory(), broker_factory()
        task = submit(first)
        assert claim_one(first).task.id == task.id
        assert steps.claim(second, "q", 5, TTL) == []
        assert steps.claim(first, "q", 5, TTL) == []

    @pytest.mark.parametrize("limit", [0, -1])
    def test_claim_rejects_a_limit_below_one(self, broker: Broker, limit: int) -> None:
        submit(broker)
        with pytest.raises(ValueError):
            steps.claim(broker, "q", limit, TTL)
        assert steps.queue_length(broker, "q") == 1

    def test_claim_rejects_a_non_positive_lease_ttl(self, broker: Broker) -> None:
        submit(broker)
        with pytest.raises(ValueError):
            steps.claim(broker, "q", 1, timedelta(0))
        assert steps.queue_length(broker, "q") == 1


class WaitContract:
    """`wait_for_work`: woken by new work, quiet otherwise (seed: BlockingDequeue, Notify)."""

    def test_wait_for_work_times_out_with_false_when_nothing_comes(self, broker: Broker) -> None:
        assert broker.wait_for_work(["q"], TINY_WAIT) is False

    def test_wait_for_work_returns_true_at_once_when_work_is_due(self, broker: Broker) -> None:
        submit(broker)
        started = time.monotonic()
        assert broker.wait_for_work(["q"], LONG_WAIT) is True
        assert time.monotonic() - started < WOKEN_WITHIN

    def test_wait_for_work_ignores_other_queues(self, broker: Broker) -> None:
        submit(broker, queue="other")
        assert broker.wait_for_work(["q"], TINY_WAIT) is False

    def test_wait_for_work_ignores_tasks_not_yet_due(self, broker: Broker) -> None:
        submit(broker, delay=timedelta(hours=1))
        assert broker.wait_for_work(["q"], TINY_WAIT) is False

    def test_wait_for_work_with_no_timeout_answers_whether_work_is_due_now(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        # The runtime asks this before claiming from a metered queue: a False while work is
        # due would leave it unclaimed until the next poll.
        assert broker.wait_for_work(["q"], 0) is False
        submit(broker, delay=timedelta(seconds=5))
        assert broker.wait_for_work(["q"], 0) is False
        clock.advance(5)
        assert broker.wait_for_work(["q"], 0) is True
        assert broker.wait_for_work(["q"], 0.0) is True  # asked again: still due, nothing consumed
        assert broker.wait_for_work(["other"], 0) is False

    def test_wait_for_work_is_woken_by_an_enqueue_from_another_thread(self, broker: Broker) -> None:
        self._assert_woken_by(broker, lambda: submit(broker))

    def test_wait_for_work_sees_an_enqueue_through_another_broker(
        self, broker_factory: BrokerFactory
    ) -> None:
        waiter, submitter = broker_factory(), broker_factory()
        self._assert_woken_by(waiter, lambda: submit(submitter))

    def test_wait_for_work_is_woken_by_a_dependency_wake_up(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        submit(broker, depends_on=(parent.id,))
        lease = claim_one(broker, "parents")
        self._assert_woken_by(broker, lambda: steps.ack(broker, parent.id, lease.token, None))

    def test_wait_for_work_is_woken_by_a_requeue(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        self._assert_woken_by(broker, lambda: steps.requeue(broker, task.id, lease.token))

    def test_wait_for_work_is_woken_by_a_retry_due_now(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        self._assert_woken_by(
            broker,
            lambda: steps.retry(
                broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="x", delay=timedelta(0)
            ),
        )

    def test_close_wakes_a_waiter(self, broker_factory: BrokerFactory) -> None:
        waiter = broker_factory()
        outcome = race([lambda: _wait_or_error(waiter), lambda: waiter.close()])
        # Whether close came before or during the wait, the waiter never sits out its timeout.
        assert outcome[0].ok and outcome[0].value is not None
        assert outcome[0].value < WOKEN_WITHIN

    def test_wait_for_work_rejects_a_negative_timeout(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            broker.wait_for_work(["q"], -1.0)

    @staticmethod
    def _assert_woken_by(waiter: Broker, action: Callable[[], object]) -> None:
        """``action`` races a wait on ``waiter``: the wait ends True, long before its timeout."""

        def act_after_a_head_start() -> object:
            # Not a timing assumption: the test passes in either order. The pause only makes
            # the interesting order (waiter already blocked, then woken) the usual one.
            threading.Event().wait(HEAD_START)
            return action()

        started = time.monotonic()
        wait, act = race([lambda: waiter.wait_for_work(["q"], LONG_WAIT), act_after_a_head_start])
        assert act.ok, act.error
        assert (wait.error, wait.value) == (None, True)
        assert time.monotonic() - started < WOKEN_WITHIN


def _wait_or_error(broker: Broker) -> float:
    """Seconds a wait took; a `BrokerError` from a broker already closed also counts as prompt."""
    started = time.monotonic()
    try:
        broker.wait_for_work(["q"], LONG_WAIT)
    except BrokerError:
        pass
    return time.monotonic() - started
