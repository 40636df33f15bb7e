"""Contract: hard quota windows -- epoch-aligned, shared, never over-issued."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from taskgate.brokers.base import Broker, QuotaGrant
from taskgate.clock import ManualClock
from taskgate.task import Status
from taskgate.testing.contract._fixtures import START, BrokerFactory
from taskgate.testing.contract._support import TTL, new_task, race

__all__ = ["QuotaClaimContract", "QuotaContract"]

MINUTE = timedelta(minutes=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RESERVERS = 16


def _require_shared_quota(broker: Broker) -> None:
    if not broker.capabilities.shared_quota:
        pytest.skip("broker does not declare capabilities.shared_quota")


class QuotaContract:
    """reserve_quota / release_quota."""

    def test_reserve_grants_units_of_an_epoch_aligned_window(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        clock.advance(90)
        grant = broker.reserve_quota("api", 5, MINUTE, 2)
        assert (grant.key, grant.granted, grant.limit) == ("api", 2, 5)
        assert grant.window_start == START + MINUTE
        assert grant.window_end == START + 2 * MINUTE
        assert (grant.window_start - EPOCH) % MINUTE == timedelta(0)

    def test_a_day_window_starts_at_midnight_utc(self, broker: Broker, clock: ManualClock) -> None:
        clock.advance(timedelta(hours=13, minutes=5))
        grant = broker.reserve_quota("daily", 100, timedelta(hours=24))
        assert (grant.window_start, grant.window_end) == (START, START + timedelta(hours=24))

    def test_reserve_grants_only_what_is_left(self, broker: Broker) -> None:
        assert broker.reserve_quota("api", 3, MINUTE, 2).granted == 2
        assert broker.reserve_quota("api", 3, MINUTE, 2).granted == 1

    def test_exhausted_window_grants_zero(self, broker: Broker) -> None:
        assert broker.reserve_quota("api", 3, MINUTE, 3).granted == 3
        grant = broker.reserve_quota("api", 3, MINUTE, 1)
        assert (grant.granted, grant.limit) == (0, 3)

    def test_reserve_of_zero_units_grants_zero(self, broker: Broker) -> None:
        assert broker.reserve_quota("api", 3, MINUTE, 0).granted == 0
        assert broker.reserve_quota("api", 3, MINUTE, 3).granted == 3

    def test_next_window_starts_fresh(self, broker: Broker, clock: ManualClock) -> None:
        assert broker.reserve_quota("api", 3, MINUTE, 3).granted == 3
        clock.advance(59)
        assert broker.reserve_quota("api", 3, MINUTE, 1).granted == 0
        clock.advance(1)
        grant = broker.reserve_quota("api", 3, MINUTE, 5)
        assert (grant.granted, grant.window_start) == (3, START + MINUTE)

    def test_release_gives_units_back_to_the_window(self, broker: Broker) -> None:
        grant = broker.reserve_quota("api", 3, MINUTE, 3)
        broker.release_quota(grant, 2)
        assert broker.reserve_quota("api", 3, MINUTE, 5).granted == 2

    def test_release_of_an_old_window_does_not_feed_the_current_one(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        old = broker.reserve_quota("api", 3, MINUTE, 3)
        clock.advance(MINUTE)
        assert broker.reserve_quota("api", 3, MINUTE, 3).granted == 3
        broker.release_quota(old, 3)
        assert broker.reserve_quota("api", 3, MINUTE, 1).granted == 0

    def test_keys_have_separate_budgets(self, broker: Broker) -> None:
        assert broker.reserve_quota("a", 2, MINUTE, 2).granted == 2
        assert broker.reserve_quota("b", 2, MINUTE, 2).granted == 2

    def test_two_brokers_share_one_key(self, broker_factory: BrokerFactory) -> None:
        first, second = broker_factory(), broker_factory()
        _require_shared_quota(first)
        assert first.reserve_quota("shared", 3, MINUTE, 2).granted == 2
        assert second.reserve_quota("shared", 3, MINUTE, 2).granted == 1
        grant = second.reserve_quota("shared", 3, MINUTE, 1)
        assert grant.granted == 0
        first.release_quota(QuotaGrant("shared", grant.window_start, grant.window_end, 1, 3), 1)
        assert second.reserve_quota("shared", 3, MINUTE, 1).granted == 1

    @pytest.mark.parametrize(("limit", "n"), [(0, 1), (-1, 1), (3, -1)])
    def test_reserve_rejects_bad_numbers(self, broker: Broker, limit: int, n: int) -> None:
        with pytest.raises(ValueError):
            broker.reserve_quota("api", limit, MINUTE, n)
        assert broker.reserve_quota("api", 3, MINUTE, 3).granted == 3

    def test_reserve_rejects_a_non_positive_period(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            broker.reserve_quota("api", 3, timedelta(0), 1)

    def test_release_rejects_a_negative_count(self, broker: Broker) -> None:
        grant = broker.reserve_quota("api", 3, MINUTE, 1)
        with pytest.raises(ValueError):
            broker.release_quota(grant, -1)

    def test_concurrent_reservers_never_over_issue(self, broker_factory: BrokerFactory) -> None:
        brokers = [broker_factory() for _ in range(RESERVERS)]
        _require_shared_quota(brokers[0])
        limit = 20

        def take_until_empty(broker: Broker) -> int:
            taken = 0
            while (granted := broker.reserve_quota("hot", limit, MINUTE, 2).granted) > 0:
                assert granted <= 2
                taken += granted
            return taken

        outcomes = race([partial(take_until_empty, b) for b in brokers])
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        assert sum(o.value or 0 for o in outcomes) == limit

    def test_reservers_racing_across_a_window_edge_never_over_issue(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        brokers = [broker_factory() for _ in range(RESERVERS)]
        _require_shared_quota(brokers[0])
        limit = 10
        clock.set(START + MINUTE - timedelta(seconds=1))

        def reserve_a_few(broker: Broker) -> list[QuotaGrant]:
            return [broker.reserve_quota("edge", limit, MINUTE, 1) for _ in range(4)]

        def cross_the_edge() -> list[QuotaGrant]:
            clock.advance(1)
            return []

        actions: list[Callable[[], list[QuotaGrant]]] = [partial(reserve_a_few, b) for b in brokers]
        actions.insert(RESERVERS // 2, cross_the_edge)
        outcomes = race(actions)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        per_window: defaultdict[datetime, int] = defaultdict(int)
        for grant in (g for o in outcomes for g in (o.value or [])):
            assert grant.window_start in (START, START + MINUTE)
            assert grant.window_end == grant.window_start + MINUTE
            per_window[grant.window_start] += grant.granted
        assert all(total <= limit for total in per_window.values()), dict(per_window)
        left = brokers[0].reserve_quota("edge", limit, MINUTE, 2 * limit).granted
        assert left == limit - per_window[START + MINUTE]


class QuotaClaimContract:
    """claim_within_quota: claim and quota as one step, units only for tasks claimed."""

    def test_claims_no_more_tasks_than_units_left(self, broker: Broker) -> None:
        broker.enqueue([new_task() for _ in range(5)])
        assert broker.reserve_quota("api", 4, MINUTE, 1).granted == 1
        taken = broker.claim_within_quota("q", 10, TTL, key="api", quota_limit=4, period=MINUTE)
        assert (len(taken.leases), taken.grant.granted, taken.exhausted) == (3, 3, False)
        assert {lease.task.status for lease in taken.leases} == {Status.RUNNING}
        assert broker.reserve_quota("api", 4, MINUTE, 1).granted == 0
        assert broker.queue_length("q") == 2

    def test_units_are_spent_only_for_tasks_claimed(self, broker: Broker) -> None:
        broker.enqueue([new_task() for _ in range(2)])
        taken = broker.claim_within_quota("q", 5, TTL, key="api", quota_limit=10, period=MINUTE)
        assert (len(taken.leases), taken.grant.granted) == (2, 2)
        empty = broker.claim_within_quota("q", 5, TTL, key="api", quota_limit=10, period=MINUTE)
        assert (empty.leases, empty.grant.granted, empty.exhausted) == ([], 0, False)
        assert broker.reserve_quota("api", 10, MINUTE, 10).granted == 8

    def test_an_exhausted_window_claims_nothing_and_says_so(self, broker: Broker, clock: ManualClock) -> None:
        broker.enqueue([new_task() for _ in range(2)])
        assert broker.reserve_quota("api", 3, MINUTE, 3).granted == 3
        clock.advance(30)
        taken = broker.claim_within_quota("q", 2, TTL, key="api", quota_limit=3, period=MINUTE)
        assert (taken.leases, taken.grant.granted, taken.exhausted) == ([], 0, True)
        assert (taken.grant.window_start, taken.grant.window_end) == (START, START + MINUTE)
        assert broker.queue_length("q") == 2
        clock.advance(30)
        assert (
            len(broker.claim_within_quota("q", 2, TTL, key="api", quota_limit=3, period=MINUTE).leases) == 2
        )

    def test_claims_oldest_due_first_like_claim(self, broker: Broker, clock: ManualClock) -> None:
        first, second = new_task(), new_task()
        broker.enqueue([first])
        clock.advance(1)
        broker.enqueue([second])
        taken = broker.claim_within_quota("q", 1, TTL, key="api", quota_limit=5, period=MINUTE)
        assert [lease.task.id for lease in taken.leases] == [first.id]
        assert broker.ack(first.id, taken.leases[0].token, None).status is Status.COMPLETED

    @pytest.mark.parametrize(
        ("queue", "limit", "quota_limit", "error"),
        [("", 1, 1, ValueError), ("q", 0, 1, ValueError), ("q", 1, 0, ValueError), ("q", True, 1, TypeError)],
    )
    def test_bad_arguments_change_nothing(
        self, broker: Broker, queue: str, limit: int, quota_limit: int, error: type[Exception]
    ) -> None:
        broker.enqueue([new_task()])
        with pytest.raises(error):
            broker.claim_within_quota(queue, limit, TTL, key="api", quota_limit=quota_limit, period=MINUTE)
        assert broker.queue_length("q") == 1
        assert broker.reserve_quota("api", 1, MINUTE, 1).granted == 1

    def test_racing_claimers_never_over_issue_nor_double_claim(self, broker_factory: BrokerFactory) -> None:
        brokers = [broker_factory() for _ in range(RESERVERS)]
        _require_shared_quota(brokers[0])
        brokers[0].enqueue([new_task() for _ in range(40)])
        limit = 25
        # The window exists before the race: every claimer takes the broker's fast path (one
        # statement on PostgreSQL), where only the window row's lock keeps the count.
        assert brokers[0].reserve_quota("hot", limit, MINUTE, 0).granted == 0

        def claim_until_empty(broker: Broker) -> list[str]:
            ids: list[str] = []
            while (
                taken := broker.claim_within_quota("q", 3, TTL, key="hot", quota_limit=limit, period=MINUTE)
            ).leases:
                ids += [lease.task.id for lease in taken.leases]
            return ids

        outcomes = race([partial(claim_until_empty, b) for b in brokers])
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        claimed = [task_id for o in outcomes for task_id in (o.value or [])]
        assert len(claimed) == len(set(claimed)) == limit
        assert brokers[0].reserve_quota("hot", limit, MINUTE, 1).granted == 0
        assert brokers[0].queue_length("q") == 40 - limit
