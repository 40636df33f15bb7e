"""Contract: hard quota windows -- epoch-aligned, shared, never over-issued."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from taskgate.brokers.base import Broker, QuotaGrant
from taskgate.clock import ManualClock
from taskgate.testing.contract._fixtures import START, BrokerFactory
from taskgate.testing.contract._support import race

__all__ = ["QuotaContract"]

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
