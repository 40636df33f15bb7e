"""Contract: `AckCarrier.claim_after_acks`, for brokers implementing it.

Not part of `BrokerContract`: add `AckCarrierContract` to the test class of a broker that has
the method (declaring ``acks_in_claims`` or not: the SQL broker has it on every dialect and
declares it on SQLite only). Every test holds the call to what `QuietAcker.ack_many_quiet`
followed by `Broker.claim` do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

from taskgate.brokers.base import AckCarrier, Broker
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status, Task
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    BAD_ACK_ITEMS,
    RACE_ROUNDS,
    TTL,
    ack_item,
    claim_many,
    nonzero_counts,
    race_pair,
    submit,
)

__all__ = ["AckCarrierContract"]

MINUTE = timedelta(minutes=1)

# Claim arguments `Broker.claim` refuses, each with its error: (queue, limit, lease_ttl).
BAD_CLAIMS: list[tuple[tuple[Any, Any, Any], type[Exception]]] = [
    (("", 1, TTL), ValueError),
    ((5, 1, TTL), TypeError),
    (("q", 0, TTL), ValueError),
    (("q", 1, timedelta(0)), ValueError),
]


def _carrier(broker: Broker) -> AckCarrier:
    assert callable(getattr(broker, "claim_after_acks", None)), "AckCarrierContract needs claim_after_acks"
    return cast(AckCarrier, broker)


class AckCarrierContract:
    """Quiet acks and a claim in one call, doing exactly what the two do one after the other."""

    def test_acks_and_claim_do_what_a_quiet_ack_and_a_claim_do(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        done, done_none, stale = claim_many(broker, 3)
        waiting = [submit(broker).id for _ in range(3)]
        unknown = new_id()
        clock.advance(1)
        stale_item = (stale.task.id, "bad-token", b"x")
        items = [ack_item(done, b"\x00r"), ack_item(done_none), stale_item, (unknown, "t", None)]
        answers, leases = _carrier(broker).claim_after_acks(items, "q", 2, TTL)
        assert answers[:2] == [None, None]
        assert isinstance(answers[2], LeaseLostError) and "another lease" in str(answers[2])
        assert isinstance(answers[3], TaskNotFoundError) and unknown in str(answers[3])
        assert leases is not None and [lease.task.id for lease in leases] == waiting[:2]
        assert {lease.expires_at for lease in leases} == {clock.now() + TTL}
        for lease in leases:
            assert broker.get(lease.task.id).status is Status.RUNNING
        stored = broker.get(done.task.id)
        assert (stored.status, stored.result, stored.finished_at) == (Status.COMPLETED, b"\x00r", clock.now())
        assert broker.get(done_none.task.id).result is None
        untouched = broker.get(stale.task.id)
        assert (untouched.status, untouched.result) == (Status.RUNNING, None)
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 2, Status.RUNNING: 3, Status.PENDING: 1}}

    def test_the_claim_leases_a_child_the_acks_made_ready(self, broker: Broker) -> None:
        (parent,) = claim_many(broker, 1, queue="parents")
        child = submit(broker, depends_on=(parent.task.id,))
        assert broker.get(child.id).status is Status.BLOCKED
        answers, leases = _carrier(broker).claim_after_acks([ack_item(parent)], "q", 5, TTL)
        assert answers == [None]
        assert leases is not None and [lease.task.id for lease in leases] == [child.id]

    def test_acks_report_the_child_they_woke_as_it_was_before_the_claim_leased_it(
        self, broker: Broker
    ) -> None:
        reported: list[list[Task]] = []
        broker.report_settled(reported.append)  # `Broker.report_settled`'s sink
        (parent,) = claim_many(broker, 1, queue="parents")
        child = submit(broker, depends_on=(parent.task.id,))
        _, leases = _carrier(broker).claim_after_acks([ack_item(parent)], "q", 5, TTL)
        assert leases is not None and [lease.task.status for lease in leases] == [Status.RUNNING]
        assert [[(task.id, task.status) for task in tasks] for tasks in reported] == [
            [(child.id, Status.PENDING)]
        ]

    def test_without_acks_it_is_a_plain_claim(self, broker: Broker) -> None:
        first = submit(broker)
        answers, leases = _carrier(broker).claim_after_acks([], "q", 5, TTL)
        assert answers == [] and leases is not None
        assert [lease.task.id for lease in leases] == [first.id]

    def test_an_empty_queue_still_takes_the_acks(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1, queue="other")
        answers, leases = _carrier(broker).claim_after_acks([ack_item(lease, b"ok")], "q", 5, TTL)
        assert (answers, leases) == ([None], [])
        assert broker.get(lease.task.id).status is Status.COMPLETED

    @pytest.mark.parametrize(("bad", "error"), BAD_ACK_ITEMS)
    def test_bad_items_change_nothing_and_claim_nothing(
        self, broker: Broker, bad: object, error: type[Exception]
    ) -> None:
        (lease,) = claim_many(broker, 1)
        waiting = submit(broker)
        items = [ack_item(lease), *bad] if isinstance(bad, list) else bad
        with pytest.raises(error):
            _carrier(broker).claim_after_acks(items, "q", 5, TTL)  # type: ignore[arg-type]
        assert broker.get(lease.task.id).status is Status.RUNNING
        assert broker.get(waiting.id).status is Status.PENDING

    @pytest.mark.parametrize(("claim", "error"), BAD_CLAIMS)
    def test_bad_claim_arguments_change_nothing(
        self, broker: Broker, claim: tuple[Any, Any, Any], error: type[Exception]
    ) -> None:
        (lease,) = claim_many(broker, 1)
        with pytest.raises(error):
            _carrier(broker).claim_after_acks([ack_item(lease)], *claim)
        assert broker.get(lease.task.id).status is Status.RUNNING

    def test_acks_and_a_claim_within_a_quota_spend_a_unit_per_task_claimed(self, broker: Broker) -> None:
        first, second = claim_many(broker, 2)
        waiting = [submit(broker).id for _ in range(3)]
        assert broker.reserve_quota("api", 4, MINUTE, 1).granted == 1
        answers, taken = _carrier(broker).claim_within_quota_after_acks(
            [ack_item(first, b"r")], "q", 5, TTL, key="api", quota_limit=4, period=MINUTE
        )
        assert answers == [None] and taken is not None
        assert ([lease.task.id for lease in taken.leases], taken.grant.granted) == (waiting, 3)
        assert not taken.exhausted and broker.get(first.task.id).result == b"r"
        answers, empty = _carrier(broker).claim_within_quota_after_acks(
            [ack_item(second)], "q", 5, TTL, key="api", quota_limit=4, period=MINUTE
        )
        assert answers == [None] and empty is not None
        assert (empty.leases, empty.grant.granted, empty.exhausted) == ([], 0, True)
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 2, Status.RUNNING: 3}}

    def test_a_claim_within_a_quota_the_broker_refuses_writes_no_ack(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1)
        with pytest.raises(ValueError, match="quota limit must be >= 1"):
            _carrier(broker).claim_within_quota_after_acks(
                [ack_item(lease)], "q", 5, TTL, key="api", quota_limit=0, period=MINUTE
            )
        assert broker.get(lease.task.id).status is Status.RUNNING
        assert broker.reserve_quota("api", 4, MINUTE, 4).granted == 4

    def test_racing_a_plain_claim_leases_each_task_once(self, broker_factory: BrokerFactory) -> None:
        first, second = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            acks = [ack_item(lease) for lease in claim_many(first, 2)]
            waiting = {submit(first).id for _ in range(4)}
            carried, plain = race_pair(
                lambda: _carrier(first).claim_after_acks(acks, "q", 3, TTL),  # noqa: B023 (run at once)
                lambda: second.claim("q", 3, TTL),
            )
            assert carried.ok and plain.ok, (carried.error, plain.error)
            assert carried.value is not None and carried.value[0] == [None, None]
            # SKIP LOCKED lets a claim pass over a row the other holds locked for a moment and
            # does not take (MariaDB locks rows its scan looks at), so one may come back short;
            # what a race must never do is lease a task twice. The next claim takes the rest.
            left = second.claim("q", 4, TTL)
            leased = [lease.task.id for lease in [*(carried.value[1] or []), *(plain.value or []), *left]]
            assert len(leased) == len(set(leased)) == 4 and set(leased) == waiting
            second.ack_many([(lease.task.id, lease.token, None) for lease in [*(plain.value or []), *left]])
            first.ack_many([(lease.task.id, lease.token, None) for lease in carried.value[1] or []])
        assert nonzero_counts(first) == {"t": {Status.COMPLETED: 6 * RACE_ROUNDS}}
