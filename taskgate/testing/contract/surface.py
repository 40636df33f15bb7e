"""Contract: the broker's public surface is the protocol's -- its verbs, none of the retired ones."""

from __future__ import annotations

import pytest

from taskgate.brokers.base import Broker, Capabilities

__all__ = ["RETIRED", "SurfaceContract"]

# Methods the one-verb protocol replaced; a broker may keep their work as private helpers.
RETIRED = (
    "enqueue",
    "enqueue_quiet",
    "history",
    "claim_within_quota",
    "claim_after_acks",
    "claim_within_quota_after_acks",
    "claim_with_limits",
    "claim_with_limits_after_acks",
    "acquire_slots",
    "take_rate",
    "ack",
    "ack_many",
    "ack_many_quiet",
    "retry",
    "fail",
    "requeue",
    "finish_canceled",
    "reserve_quota",
    "release_quota",
    "renew_slots",
    "release_slots",
    "queue_length",
)


class SurfaceContract:
    """What a broker offers: the `Broker` protocol and declared `Capabilities`, nothing retired."""

    def test_the_broker_implements_the_protocol(self, broker: Broker) -> None:
        assert isinstance(broker, Broker)
        assert isinstance(broker.capabilities, Capabilities)

    @pytest.mark.parametrize("name", RETIRED)
    def test_no_retired_method_is_public(self, broker: Broker, name: str) -> None:
        assert not hasattr(broker, name), f"{type(broker).__name__}.{name} is retired: use the verbs"
