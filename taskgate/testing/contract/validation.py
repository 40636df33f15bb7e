"""Contract: bad input raises a clear error and changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskgate.brokers.base import MAX_DELAY, Broker, FailureKind
from taskgate.task import Filter
from taskgate.testing.contract._support import TTL, claim_one, submit

__all__ = ["ValidationContract"]


class ValidationContract:
    """Malformed ids and out-of-range numbers are refused before anything changes."""

    @pytest.mark.parametrize("bad_id", ["", "x" * 256, "nul\x00byte"])
    def test_get_of_a_malformed_id_raises_value_error(self, broker: Broker, bad_id: str) -> None:
        with pytest.raises(ValueError):
            broker.get(bad_id)

    def test_history_of_an_oversized_key_raises_value_error(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            broker.history("k" * 256)

    def test_retry_with_a_negative_delay_raises_and_keeps_the_lease(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        with pytest.raises(ValueError):
            broker.retry(
                task.id, lease.token, kind=FailureKind.BUSINESS, error="x", delay=timedelta(seconds=-1)
            )
        assert broker.get(task.id) == lease.task
        assert broker.heartbeat(task.id, lease.token, TTL).cancel_requested is False

    @pytest.mark.parametrize("delay", [MAX_DELAY + timedelta(days=1), timedelta(seconds=1e12)])
    def test_retry_with_a_delay_beyond_the_maximum_raises_and_keeps_the_lease(
        self, broker: Broker, delay: timedelta
    ) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        with pytest.raises(ValueError, match="delay must be a timedelta from 0 to"):
            broker.retry(task.id, lease.token, kind=FailureKind.THROTTLED, error="x", delay=delay)
        assert broker.get(task.id) == lease.task
        assert broker.list(Filter()) == [lease.task]
        assert broker.heartbeat(task.id, lease.token, TTL).cancel_requested is False

    def test_heartbeat_with_a_non_positive_ttl_raises_value_error(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        with pytest.raises(ValueError):
            broker.heartbeat(task.id, lease.token, timedelta(0))
        assert broker.get(task.id) == lease.task

    def test_reap_with_a_limit_below_one_raises_value_error(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            broker.reap(lease_lost_max=3, limit=0)

    def test_enqueue_of_a_business_key_twice_in_one_batch_raises_and_stores_nothing(
        self, broker: Broker
    ) -> None:
        from taskgate.testing.contract._support import new_task

        with pytest.raises(ValueError):
            broker.enqueue([new_task(business_key="same"), new_task(business_key="same")])
        assert broker.list(Filter()) == []
