"""Contract: a queue's state -- its backlog and its quota window's figures, read, never changed.

`Broker.queue_state` counts a queue's pending and retrying tasks and, given a `QuotaSpec`,
reads that budget's current window as claims find it: what they took (``used``), what they
gave back, a fresh window at 0 with its new bounds, a window older than the newest kept one
(the clock stepped back) with nothing left. The quota cases skip, naming ``shared_quota``, on
a broker that does not declare it (no quota is counted there).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from taskgate.brokers.base import Broker, FailureKind, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, GiveBack, QueueQuery, QuotaUsage, Requeue, Settle
from taskgate.clock import ManualClock
from taskgate.task import Filter
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import START, BrokerFactory
from taskgate.testing.contract._support import TTL, claim_one, new_task, submit

__all__ = ["QueueStateContract"]

MINUTE = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BUDGET = QuotaSpec("api", 5, MINUTE)


def _any(value: object) -> Any:
    """``value`` typed as anything: a call that passes what the signature forbids on purpose."""
    return value


def _usage(broker: Broker, spec: QuotaSpec = BUDGET, queue: str = "q") -> QuotaUsage:
    """``spec``'s current window as ``queue_state`` reads it (skips without ``shared_quota``)."""
    if not broker.capabilities.shared_quota:
        pytest.skip("broker does not declare capabilities.shared_quota")
    state = broker.queue_state(QueueQuery(queue, spec))
    assert state.quota is not None, "a queue_state with a quota answers its figures"
    assert (state.quota.key, state.quota.limit) == (spec.key, spec.limit)
    return state.quota


def _claim(broker: Broker, n: int, spec: QuotaSpec = BUDGET) -> Claimed:
    """Submit ``n`` tasks to queue "q" and claim them within ``spec``."""
    steps.enqueue(broker, [new_task() for _ in range(n)])
    return broker.claim(Claim("q", n, TTL, quota=spec))


class QueueStateContract:
    """A queue's backlog and its quota figures (`Broker.queue_state`)."""

    def test_queue_state_counts_pending_and_retrying_due_or_not(self, broker: Broker) -> None:
        submit(broker)
        submit(broker, delay=timedelta(hours=1))
        retried = submit(broker)
        submit(broker, depends_on=(retried.id,))
        leases = steps.claim(broker, "q", 2, TTL)
        lease = next(x for x in leases if x.task.id == retried.id)
        steps.retry(broker, retried.id, lease.token, kind=FailureKind.BUSINESS, error="x", delay=TTL)
        # pending (delayed), retrying; the other claimed one is running, the child blocked.
        assert broker.queue_state(QueueQuery("q")).queue_len == 2
        assert steps.queue_length(broker, "unknown-queue") == 0

    def test_queue_state_does_not_count_final_tasks(self, broker: Broker) -> None:
        done, failed, canceled = submit(broker), submit(broker), submit(broker)
        steps.ack(broker, done.id, claim_one(broker).token)
        steps.fail(broker, failed.id, claim_one(broker).token, kind=FailureKind.SKIP, error="x")
        broker.cancel(canceled.id)
        submit(broker)
        assert steps.queue_length(broker, "q") == 1

    def test_queue_state_without_a_quota_reads_no_figures(self, broker: Broker) -> None:
        submit(broker)
        assert broker.queue_state(QueueQuery("q")).quota is None

    def test_quota_figures_before_any_claim_are_a_fresh_window(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        clock.advance(90)
        usage = _usage(broker)
        assert usage.used == 0
        assert (usage.window_start, usage.window_end) == (START + MINUTE, START + 2 * MINUTE)
        assert (usage.window_start - EPOCH) % MINUTE == timedelta(0)

    def test_quota_used_rises_with_each_claim_within_the_quota(self, broker: Broker) -> None:
        _usage(broker)
        assert len(_claim(broker, 2).leases) == 2
        assert _usage(broker).used == 2
        assert len(_claim(broker, 1).leases) == 1
        assert _usage(broker).used == 3
        assert steps.queue_length(broker, "q") == 0

    def test_quota_used_falls_when_units_are_given_back(self, broker: Broker) -> None:
        taken = _claim(broker, 3)
        assert taken.quota is not None and _usage(broker).used == 3
        requeued = tuple(Requeue(lease.task.id, lease.token) for lease in taken.leases[:2])
        broker.settle(Settle(requeued, give_back=GiveBack(quota=((taken.quota, 2),))))
        assert _usage(broker).used == 1
        assert steps.queue_length(broker, "q") == 2

    def test_quota_figures_of_the_next_window_start_at_zero_with_new_bounds(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        _claim(broker, 5)
        exhausted = _usage(broker)
        assert (exhausted.used, exhausted.window_end) == (5, START + MINUTE)
        clock.advance(MINUTE)
        fresh = _usage(broker)
        assert fresh.used == 0
        assert (fresh.window_start, fresh.window_end) == (START + MINUTE, START + 2 * MINUTE)

    def test_quota_used_is_never_reported_above_the_limit(self, broker: Broker) -> None:
        _claim(broker, 4)
        assert _usage(broker, QuotaSpec("api", 2, MINUTE)).used == 2
        assert _usage(broker).used == 4

    def test_a_window_older_than_the_newest_kept_has_nothing_left(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        clock.advance(2 * MINUTE)
        _claim(broker, 1)  # the key's newest window starts at START + 2 min
        # The window now holding "now" began before that one: as after the medium's clock stepped
        # back (one test clock cannot), here because the period grew (a redeploy): its count is
        # not known, so nothing is left in it.
        longer = QuotaSpec(BUDGET.key, BUDGET.limit, 3 * MINUTE)
        usage = _usage(broker, longer)
        assert (usage.used, usage.window_start) == (longer.limit, START)
        assert _claim(broker, 1, longer).leases == []  # as a claim finds it

    def test_quota_figures_are_read_from_the_shared_store(self, broker_factory: BrokerFactory) -> None:
        worker, reader = broker_factory(), broker_factory()
        _claim(worker, 2)
        assert _usage(reader).used == 2
        assert _usage(reader, QuotaSpec("other", 5, MINUTE)).used == 0

    def test_reading_the_quota_takes_no_unit_and_changes_no_task(self, broker: Broker) -> None:
        submit(broker)
        before = broker.list(Filter())
        for _ in range(3):
            assert _usage(broker).used == 0
        assert broker.list(Filter()) == before
        assert len(_claim(broker, BUDGET.limit).leases) == BUDGET.limit  # every unit still there

    def test_a_queue_name_alone_is_refused_naming_queue_query(self, broker: Broker) -> None:
        with pytest.raises(TypeError, match="QueueQuery"):
            broker.queue_state(_any("q"))
