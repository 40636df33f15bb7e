"""Contract: a queue held -- by hand (`Broker.hold`) or by a queue-wide throttle (``Retry.hold_queue``).

While a queue is held no claim leases its tasks: the claim answers ``Claimed.held_until`` and
spends nothing (no quota unit, no shared slot), though the acks it carries are written. The
hold ends when the clock reaches it, or at once on a resume; a hold never shortens a longer
one; `Broker.queue_state` reads it. Every broker honours holds: no capability gates them.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from taskgate.brokers.base import Broker, FailureKind, QuotaSpec
from taskgate.brokers.params import (
    HELD_INDEFINITELY,
    Claim,
    Claimed,
    Hold,
    QueueQuery,
    Retry,
    Settle,
    SharedLimits,
)
from taskgate.clock import ManualClock
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import START, BrokerFactory
from taskgate.testing.contract._support import (
    RACE_ROUNDS,
    TTL,
    ack_item,
    claim_one,
    new_task,
    race_pair,
    submit,
)

__all__ = ["HoldContract"]

SECOND = timedelta(seconds=1)


def _any(value: object) -> Any:
    """``value`` typed as anything: a call that passes what the signature forbids on purpose."""
    return value


def _claim(broker: Broker, queue: str = "q", limit: int = 10, **fields: Any) -> Claimed:
    return broker.claim(Claim(queue, limit, TTL, **fields))


def _held(broker: Broker, queue: str = "q") -> Any:
    return broker.queue_state(QueueQuery(queue)).held_until


def _throttle(broker: Broker, delay: timedelta, *, queue: str = "q") -> Any:
    """Claim one task of ``queue`` and retry it as throttled, holding the queue for ``delay``."""
    lease = claim_one(broker, queue)
    item = Retry(lease.task.id, lease.token, FailureKind.THROTTLED, "busy", delay, hold_queue=True)
    (answer,) = broker.settle(Settle((item,)))
    return answer


class HoldContract:
    """Holding a queue: claims lease nothing until the hold ends or the queue is resumed."""

    def test_a_queue_held_for_a_while_leases_nothing_and_answers_its_hold_until_the_clock_passes_it(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        task = submit(broker)
        other = submit(broker, queue="other")
        assert broker.hold(Hold("q", for_=10 * SECOND)) == START + 10 * SECOND
        clock.advance(9 * SECOND)
        claimed = _claim(broker)
        assert (claimed.leases, claimed.held_until) == ([], START + 10 * SECOND)
        assert broker.get(task.id).status is Status.PENDING
        assert [lease.task.id for lease in _claim(broker, "other").leases] == [other.id]
        clock.advance(SECOND)
        claimed = _claim(broker)
        assert ([lease.task.id for lease in claimed.leases], claimed.held_until) == ([task.id], None)

    def test_queue_state_reports_a_hold_until_it_ends(self, broker: Broker, clock: ManualClock) -> None:
        assert _held(broker) is None
        broker.hold(Hold("q", for_=5 * SECOND))
        assert _held(broker) == START + 5 * SECOND
        assert _held(broker, "other") is None
        clock.advance(5 * SECOND)
        assert _held(broker) is None

    def test_a_queue_held_until_resumed_stays_held_until_the_resume(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        task = submit(broker)
        assert broker.hold(Hold("q")) == HELD_INDEFINITELY
        clock.advance(timedelta(days=400))
        assert _claim(broker).held_until == HELD_INDEFINITELY
        assert _held(broker) == HELD_INDEFINITELY
        assert broker.hold(Hold("q", resume=True)) is None
        assert _held(broker) is None
        assert [lease.task.id for lease in _claim(broker).leases] == [task.id]

    def test_a_resume_ends_a_hold_for_a_while_and_a_queue_not_held_answers_none(self, broker: Broker) -> None:
        assert broker.hold(Hold("q", resume=True)) is None
        broker.hold(Hold("q", for_=timedelta(hours=1)))
        assert broker.hold(Hold("q", resume=True)) is None
        task = submit(broker)
        assert [lease.task.id for lease in _claim(broker).leases] == [task.id]

    def test_a_hold_never_shortens_a_longer_hold(self, broker: Broker) -> None:
        hour = timedelta(hours=1)
        assert broker.hold(Hold("q", for_=hour)) == START + hour
        assert broker.hold(Hold("q", for_=SECOND)) == START + hour
        assert broker.hold(Hold("q", for_=2 * hour)) == START + 2 * hour
        assert broker.hold(Hold("q")) == HELD_INDEFINITELY
        assert broker.hold(Hold("q", for_=hour)) == HELD_INDEFINITELY

    def test_a_hold_racing_a_resume_answers_the_hold_it_left(self, broker_factory: BrokerFactory) -> None:
        # A shorter hold keeps the longer one without changing the row: it must still answer a
        # hold, never a resume that landed between its write and its read.
        hour = timedelta(hours=1)
        holder, resumer = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS * 4):
            holder.hold(Hold("q", for_=2 * hour))
            held, resumed = race_pair(
                lambda: holder.hold(Hold("q", for_=hour)), lambda: resumer.hold(Hold("q", resume=True))
            )
            assert held.ok and resumed.ok, (held.error, resumed.error)
            assert held.value in (START + hour, START + 2 * hour)

    def test_a_retry_holding_the_queue_holds_it_until_its_delay_ends(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        first, second = steps.enqueue(broker, [new_task(), new_task()])
        retried = _throttle(broker, 30 * SECOND)
        assert (retried.id, retried.status, retried.throttled) == (first.id, Status.RETRYING, 1)
        assert _held(broker) == START + 30 * SECOND
        clock.advance(29 * SECOND)
        assert _claim(broker).held_until == START + 30 * SECOND
        assert broker.get(second.id).status is Status.PENDING
        clock.advance(SECOND)
        claimed = _claim(broker)
        assert sorted(lease.task.id for lease in claimed.leases) == sorted([first.id, second.id])
        assert claimed.held_until is None

    def test_a_retry_holding_the_queue_never_shortens_a_longer_hold(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        steps.enqueue(broker, [new_task(), new_task()])
        lease = claim_one(broker)
        broker.hold(Hold("q", for_=timedelta(minutes=5)))
        item = Retry(lease.task.id, lease.token, FailureKind.THROTTLED, "busy", 30 * SECOND, hold_queue=True)
        broker.settle(Settle((item,)))
        assert _held(broker) == START + timedelta(minutes=5)
        broker.hold(Hold("q", resume=True))
        _throttle(broker, 30 * SECOND)
        broker.hold(Hold("q"))
        clock.advance(30 * SECOND)
        assert _claim(broker).held_until == HELD_INDEFINITELY

    def test_a_retry_without_hold_queue_or_with_a_stale_token_holds_nothing(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        steps.enqueue(broker, [new_task(), new_task()])
        lease = claim_one(broker)
        steps.retry(broker, lease.task.id, lease.token, kind=FailureKind.THROTTLED, error="busy", delay=TTL)
        stale = Retry(lease.task.id, lease.token, FailureKind.THROTTLED, "busy", TTL, hold_queue=True)
        (answer,) = broker.settle(Settle((stale,)))
        assert type(answer).__name__ == "LeaseLostError"
        assert _held(broker) is None
        assert len(_claim(broker).leases) == 1

    def test_acks_carried_by_a_claim_of_a_held_queue_are_still_written(self, broker: Broker) -> None:
        submit(broker)
        lease = claim_one(broker)
        submit(broker)
        broker.hold(Hold("q", for_=TTL))
        claimed = _claim(broker, acks=(ack_item(lease, b"done"),))
        assert (claimed.leases, claimed.acked, claimed.held_until) == ([], [None], START + TTL)
        done = broker.get(lease.task.id)
        assert (done.status, done.result) == (Status.COMPLETED, b"done")

    def test_a_claim_of_a_held_queue_spends_no_quota_unit(self, broker: Broker) -> None:
        if not broker.capabilities.shared_quota:
            pytest.skip("broker does not declare capabilities.shared_quota")
        spec = QuotaSpec("api", 5, timedelta(minutes=1))
        submit(broker)
        broker.hold(Hold("q", for_=TTL))
        claimed = _claim(broker, quota=spec)
        assert (claimed.leases, claimed.held_until) == ([], START + TTL)
        state = broker.queue_state(QueueQuery("q", spec))
        assert state.quota is not None and state.quota.used == 0
        assert state.held_until == START + TTL  # read with the quota's figures too

    def test_a_claim_of_a_held_queue_takes_no_shared_slot(self, broker: Broker, clock: ManualClock) -> None:
        if not broker.capabilities.shared_limits:
            pytest.skip("broker does not declare capabilities.shared_limits")
        submit(broker)
        broker.hold(Hold("q", for_=TTL))
        shared = SharedLimits(1, claimer="a")
        claimed = _claim(broker, shared=shared)
        assert (claimed.leases, claimed.held_until) == ([], START + TTL)
        clock.advance(TTL)
        assert len(_claim(broker, shared=SharedLimits(1, claimer="b")).leases) == 1

    def test_another_broker_of_the_store_sees_the_hold(
        self, broker: Broker, broker_factory: BrokerFactory
    ) -> None:
        submit(broker)
        broker.hold(Hold("q", for_=TTL))
        other = broker_factory()
        assert _claim(other).held_until == START + TTL
        other.hold(Hold("q", resume=True))
        assert len(_claim(broker).leases) == 1

    @pytest.mark.parametrize(
        ("fields", "error", "field"),
        [
            ({"queue": ""}, ValueError, "Hold.queue"),
            ({"queue": "q", "for_": timedelta(0)}, ValueError, "Hold.for_"),
            ({"queue": "q", "for_": -SECOND}, ValueError, "Hold.for_"),
            ({"queue": "q", "for_": 5}, TypeError, "Hold.for_"),
            ({"queue": "q", "for_": timedelta(days=40_000)}, ValueError, "Hold.for_"),
            ({"queue": "q", "resume": "yes"}, TypeError, "Hold.resume"),
            ({"queue": "q", "for_": SECOND, "resume": True}, ValueError, "Hold.for_"),
        ],
    )
    def test_a_bad_hold_is_refused_naming_the_field(
        self, broker: Broker, fields: dict[str, Any], error: type[Exception], field: str
    ) -> None:
        with pytest.raises(error, match=re.escape(field)):
            Hold(**fields)
        with pytest.raises(TypeError, match=r"Retry\.hold_queue"):
            Retry("t1", "token", FailureKind.THROTTLED, "busy", SECOND, hold_queue=_any("yes"))
        assert _held(broker) is None
