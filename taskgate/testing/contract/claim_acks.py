"""Contract: ``Claim(acks=...)`` -- completions written first, then the claim, in one call.

Every broker takes the acks a claim carries (``acks_in_claims`` only says whether `Gate`
should send them that way). Each test holds the call to what a quiet settle of the acks
followed by the claim do: the claim sees what the acks wrote.
"""

from __future__ import annotations

from datetime import timedelta

from taskgate.brokers.base import Broker, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, Complete
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    RACE_ROUNDS,
    TTL,
    ack_item,
    claim_many,
    nonzero_counts,
    race_pair,
    submit,
)

__all__ = ["ClaimAcksContract"]

MINUTE = timedelta(minutes=1)


def _ids(claimed: Claimed) -> list[str]:
    return [lease.task.id for lease in claimed.leases]


class ClaimAcksContract:
    """Acks carried by a claim, doing exactly what a settle and a claim do one after the other."""

    def test_a_plain_claim_answers_no_acks_quota_or_wait(self, broker: Broker) -> None:
        first = submit(broker)
        claimed = broker.claim(Claim("q", 5, TTL))
        assert _ids(claimed) == [first.id]
        assert (claimed.acked, claimed.quota, claimed.exhausted) == ([], None, False)
        assert (claimed.retry_after, claimed.failed) == (0.0, None)

    def test_acks_and_claim_do_what_a_quiet_settle_and_a_claim_do(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        done, done_none, stale = claim_many(broker, 3)
        waiting = [submit(broker).id for _ in range(3)]
        unknown = new_id()
        clock.advance(1)
        acks = (
            ack_item(done, b"\x00r"),
            ack_item(done_none),
            Complete(stale.task.id, "bad"),
            Complete(unknown, "t"),
        )
        claimed = broker.claim(Claim("q", 2, TTL, acks=acks))
        assert claimed.acked[:2] == [None, None]
        assert isinstance(claimed.acked[2], LeaseLostError)
        assert isinstance(claimed.acked[3], TaskNotFoundError) and unknown in str(claimed.acked[3])
        assert _ids(claimed) == waiting[:2]
        assert {lease.expires_at for lease in claimed.leases} == {clock.now() + TTL}
        for lease in claimed.leases:
            assert broker.get(lease.task.id) == lease.task
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
        claimed = broker.claim(Claim("q", 5, TTL, acks=(ack_item(parent),)))
        assert (claimed.acked, _ids(claimed)) == ([None], [child.id])

    def test_acks_report_the_child_they_woke_as_it_was_before_the_claim_leased_it(
        self, broker: Broker
    ) -> None:
        reported: list[list[Task]] = []
        broker.report_settled(reported.append)
        (parent,) = claim_many(broker, 1, queue="parents")
        child = submit(broker, depends_on=(parent.task.id,))
        claimed = broker.claim(Claim("q", 5, TTL, acks=(ack_item(parent),)))
        assert [lease.task.status for lease in claimed.leases] == [Status.RUNNING]
        assert [[(task.id, task.status) for task in tasks] for tasks in reported] == [
            [(child.id, Status.PENDING)]
        ]

    def test_an_empty_queue_still_takes_the_acks(self, broker: Broker) -> None:
        (lease,) = claim_many(broker, 1, queue="other")
        claimed = broker.claim(Claim("q", 5, TTL, acks=(ack_item(lease, b"ok"),)))
        assert (claimed.acked, claimed.leases) == ([None], [])
        assert broker.get(lease.task.id).status is Status.COMPLETED

    def test_acks_and_a_claim_within_a_quota_spend_a_unit_per_task_claimed(self, broker: Broker) -> None:
        first, second = claim_many(broker, 2)
        waiting = [submit(broker).id for _ in range(4)]
        quota = QuotaSpec("api", 3, MINUTE)
        taken = broker.claim(Claim("q", 2, TTL, quota=quota, acks=(ack_item(first, b"r"),)))
        assert (taken.acked, _ids(taken), taken.exhausted) == ([None], waiting[:2], False)
        assert taken.quota is not None and taken.quota.granted == 2
        assert broker.get(first.task.id).result == b"r"
        rest = broker.claim(Claim("q", 5, TTL, quota=quota, acks=(ack_item(second),)))
        assert (rest.acked, _ids(rest)) == ([None], waiting[2:3])
        empty = broker.claim(Claim("q", 5, TTL, quota=quota))
        assert (empty.leases, empty.exhausted) == ([], True)
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 2, Status.RUNNING: 3, Status.PENDING: 1}}

    def test_racing_a_plain_claim_leases_each_task_once(self, broker_factory: BrokerFactory) -> None:
        first, second = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            acks = tuple(ack_item(lease) for lease in claim_many(first, 2))
            waiting = {submit(first).id for _ in range(4)}
            carried, plain = race_pair(
                lambda: first.claim(Claim("q", 3, TTL, acks=acks)),  # noqa: B023 (run at once)
                lambda: steps.claim(second, "q", 3, TTL),
            )
            assert carried.ok and plain.ok, (carried.error, plain.error)
            assert carried.value is not None and carried.value.acked == [None, None]
            # SKIP LOCKED lets a claim pass over a row the other holds locked for a moment and
            # does not take (MariaDB locks rows its scan looks at), so one may come back short;
            # what a race must never do is lease a task twice. The next claim takes the rest.
            left = steps.claim(second, "q", 4, TTL)
            leases = [*carried.value.leases, *(plain.value or []), *left]
            leased = [lease.task.id for lease in leases]
            assert len(leased) == len(set(leased)) == 4 and set(leased) == waiting
            steps.ack_many(second, [(lease.task.id, lease.token, None) for lease in leases])
        assert nonzero_counts(first) == {"t": {Status.COMPLETED: 6 * RACE_ROUNDS}}
