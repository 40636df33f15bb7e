"""Contract: hard quota windows through ``Claim(quota=...)`` -- epoch-aligned, shared, never over-issued.

Units are spent only for tasks claimed, so every case counts units by the tasks a claim
leases; ``Settle(give_back=GiveBack(quota=...))`` returns units to the window they came from.
Where a broker does not declare ``shared_quota`` these cases do not apply (`Gate` refuses a
quota on such a broker) and skip, naming it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from taskgate.brokers.base import Broker, QuotaGrant, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, GiveBack, Requeue, Settle
from taskgate.clock import ManualClock
from taskgate.task import Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import START, BrokerFactory
from taskgate.testing.contract._support import TTL, new_task, race

__all__ = ["QuotaContract"]

MINUTE = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CLAIMERS = 16


def _require_shared_quota(broker: Broker) -> None:
    if not broker.capabilities.shared_quota:
        pytest.skip("broker does not declare capabilities.shared_quota")


def _tasks(broker: Broker, n: int) -> None:
    steps.enqueue(broker, [new_task() for _ in range(n)])


def _claim(
    broker: Broker, limit: int, quota_limit: int, key: str = "api", period: timedelta = MINUTE
) -> Claimed:
    """A claim of up to ``limit`` tasks of queue "q", a unit of ``key``'s window each."""
    _require_shared_quota(broker)
    claimed = broker.claim(Claim("q", limit, TTL, quota=QuotaSpec(key, quota_limit, period)))
    assert claimed.quota is not None, "a claim with a quota answers its grant"
    assert claimed.quota.granted == len(claimed.leases)
    return claimed


def _grant(claimed: Claimed) -> QuotaGrant:
    assert claimed.quota is not None
    return claimed.quota


def _give_back(broker: Broker, claimed: Claimed, n: int) -> None:
    """Requeue ``n`` of the claim's tasks, giving their units back (they never ran)."""
    requeued = tuple(Requeue(lease.task.id, lease.token) for lease in claimed.leases[:n])
    answers = broker.settle(Settle(requeued, give_back=GiveBack(quota=((_grant(claimed), n),))))
    assert all(isinstance(a, Task) and a.status is Status.PENDING for a in answers), answers


class QuotaContract:
    """Quota units taken by claims, given back by settles."""

    def test_a_claim_takes_units_of_an_epoch_aligned_window(self, broker: Broker, clock: ManualClock) -> None:
        _tasks(broker, 3)
        clock.advance(90)
        grant = _grant(_claim(broker, 2, 5))
        assert (grant.key, grant.granted, grant.limit) == ("api", 2, 5)
        assert (grant.window_start, grant.window_end) == (START + MINUTE, START + 2 * MINUTE)
        assert (grant.window_start - EPOCH) % MINUTE == timedelta(0)

    def test_a_day_window_starts_at_midnight_utc(self, broker: Broker, clock: ManualClock) -> None:
        _tasks(broker, 1)
        clock.advance(timedelta(hours=13, minutes=5))
        grant = _grant(_claim(broker, 1, 100, key="daily", period=timedelta(hours=24)))
        assert (grant.window_start, grant.window_end) == (START, START + timedelta(hours=24))

    def test_a_claim_leases_no_more_tasks_than_units_left(self, broker: Broker) -> None:
        _tasks(broker, 5)
        assert len(_claim(broker, 1, 4).leases) == 1
        taken = _claim(broker, 10, 4)
        assert (len(taken.leases), taken.exhausted) == (3, False)
        assert {lease.task.status for lease in taken.leases} == {Status.RUNNING}
        assert steps.queue_length(broker, "q") == 1

    def test_units_are_spent_only_for_tasks_claimed(self, broker: Broker) -> None:
        _tasks(broker, 2)
        assert len(_claim(broker, 5, 10).leases) == 2
        empty = _claim(broker, 5, 10)
        assert (empty.leases, empty.exhausted) == ([], False)
        _tasks(broker, 10)
        assert len(_claim(broker, 10, 10).leases) == 8

    def test_an_exhausted_window_claims_nothing_and_says_so(self, broker: Broker, clock: ManualClock) -> None:
        _tasks(broker, 5)
        assert len(_claim(broker, 3, 3).leases) == 3
        clock.advance(30)
        taken = _claim(broker, 2, 3)
        assert (taken.leases, taken.exhausted) == ([], True)
        assert (_grant(taken).window_start, _grant(taken).window_end) == (START, START + MINUTE)
        assert steps.queue_length(broker, "q") == 2
        clock.advance(30)
        assert len(_claim(broker, 2, 3).leases) == 2

    def test_the_next_window_starts_fresh(self, broker: Broker, clock: ManualClock) -> None:
        _tasks(broker, 8)
        assert len(_claim(broker, 3, 3).leases) == 3
        clock.advance(59)
        assert _claim(broker, 1, 3).leases == []
        clock.advance(1)
        taken = _claim(broker, 5, 3)
        assert (len(taken.leases), _grant(taken).window_start) == (3, START + MINUTE)

    def test_a_quota_claim_takes_the_oldest_due_first_like_a_claim(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        first, second = new_task(), new_task()
        steps.enqueue(broker, [first])
        clock.advance(1)
        steps.enqueue(broker, [second])
        (lease,) = _claim(broker, 1, 5).leases
        assert lease.task.id == first.id
        assert steps.ack(broker, first.id, lease.token, None).status is Status.COMPLETED

    def test_units_given_back_return_to_their_window(self, broker: Broker) -> None:
        _tasks(broker, 3)
        taken = _claim(broker, 3, 3)
        _give_back(broker, taken, 2)
        again = _claim(broker, 5, 3)
        assert {lease.task.id for lease in again.leases} == {lease.task.id for lease in taken.leases[:2]}
        _tasks(broker, 1)
        assert _claim(broker, 1, 3).exhausted

    def test_units_given_back_to_an_old_window_do_not_feed_the_current_one(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        _tasks(broker, 8)
        old = _claim(broker, 3, 3)
        clock.advance(MINUTE)
        assert len(_claim(broker, 3, 3).leases) == 3
        _give_back(broker, old, 3)
        assert _claim(broker, 1, 3).leases == []

    def test_a_window_given_back_more_than_it_spent_stays_at_its_limit(self, broker: Broker) -> None:
        _tasks(broker, 10)
        grant = _grant(_claim(broker, 2, 3))
        for _ in range(2):  # a late duplicate: the count stops at 0, it never goes below
            assert broker.settle(Settle(give_back=GiveBack(quota=((grant, 2),)))) == []
        assert len(_claim(broker, 10, 3).leases) == 3

    def test_keys_have_separate_budgets(self, broker: Broker) -> None:
        _tasks(broker, 4)
        assert len(_claim(broker, 2, 2, key="a").leases) == 2
        assert len(_claim(broker, 2, 2, key="b").leases) == 2

    def test_two_brokers_share_one_key(self, broker_factory: BrokerFactory) -> None:
        first, second = broker_factory(), broker_factory()
        _tasks(first, 6)
        assert len(_claim(first, 2, 3).leases) == 2
        held = _claim(second, 2, 3)
        assert len(held.leases) == 1
        assert _claim(second, 1, 3).exhausted
        _give_back(first, held, 1)
        assert len(_claim(second, 1, 3).leases) == 1

    def test_racing_claimers_never_over_issue_nor_double_claim(self, broker_factory: BrokerFactory) -> None:
        brokers = [broker_factory() for _ in range(CLAIMERS)]
        limit = 25
        _tasks(brokers[0], 40)
        # The window exists before the race: every claimer takes the broker's fast path (one
        # statement on PostgreSQL), where only the window row's lock keeps the count.
        (first,) = _claim(brokers[0], 1, limit, key="hot").leases

        def claim_until_empty(broker: Broker) -> list[str]:
            ids: list[str] = []
            while taken := _claim(broker, 3, limit, key="hot").leases:
                ids += [lease.task.id for lease in taken]
            return ids

        outcomes = race([partial(claim_until_empty, b) for b in brokers])
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        claimed = [first.task.id, *(task_id for o in outcomes for task_id in (o.value or []))]
        assert len(claimed) == len(set(claimed)) == limit
        assert _claim(brokers[0], 1, limit, key="hot").exhausted
        assert steps.queue_length(brokers[0], "q") == 40 - limit

    def test_claimers_racing_across_a_window_edge_never_over_issue(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        brokers = [broker_factory() for _ in range(CLAIMERS)]
        _require_shared_quota(brokers[0])
        limit = 10
        _tasks(brokers[0], 4 * CLAIMERS)
        clock.set(START + MINUTE - timedelta(seconds=1))

        def claim_a_few(broker: Broker) -> list[QuotaGrant]:
            return [_grant(_claim(broker, 1, limit, key="edge")) for _ in range(4)]

        def cross_the_edge() -> list[QuotaGrant]:
            clock.advance(1)
            return []

        actions: list[Callable[[], list[QuotaGrant]]] = [partial(claim_a_few, b) for b in brokers]
        actions.insert(CLAIMERS // 2, cross_the_edge)
        outcomes = race(actions)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        per_window: defaultdict[datetime, int] = defaultdict(int)
        for grant in (g for o in outcomes for g in (o.value or [])):
            assert grant.window_start in (START, START + MINUTE)
            assert grant.window_end == grant.window_start + MINUTE
            per_window[grant.window_start] += grant.granted
        assert all(total <= limit for total in per_window.values()), dict(per_window)
        left = len(_claim(brokers[0], 2 * limit, limit, key="edge").leases)
        assert left == limit - per_window[START + MINUTE]
