"""Contract: `QuietAcker.ack_many_quiet`, for brokers declaring ``quiet_acks``.

Not part of `BrokerContract`: a broker without the capability has nothing to test here. Add
`QuietAckContract` to the test class of a broker that declares it. Every test holds the
quiet ack to what `Broker.ack_many` does with the same items; only the answers of the items
it completed differ (None instead of a snapshot).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest

from taskgate.brokers.base import AckItem, Broker, QuietAcker
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

__all__ = ["QuietAckContract"]


def _quiet(broker: Broker) -> QuietAcker:
    assert broker.capabilities.quiet_acks, "QuietAckContract is for brokers with quiet_acks"
    return cast(QuietAcker, broker)


class QuietAckContract:
    """Acks that answer None for what they completed, and otherwise do what `ack_many` does."""

    def test_quiet_acks_of_no_items_return_an_empty_list(self, broker: Broker) -> None:
        assert _quiet(broker).ack_many_quiet([]) == []

    def test_a_quiet_ack_stores_exactly_what_ack_many_stores(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        loud, quiet, loud_none, quiet_none = claim_many(broker, 4)
        broker.cancel(quiet.task.id)  # a cancel mark does not stop an ack, and leaves no trace
        broker.cancel(loud.task.id)
        clock.advance(1)
        answers = broker.ack_many([ack_item(loud, b"\x00r"), ack_item(loud_none)])
        quiet_answers = _quiet(broker).ack_many_quiet([ack_item(quiet, b"\x00r"), ack_item(quiet_none)])
        assert quiet_answers == [None, None]
        for twin, answer in zip((quiet, quiet_none), answers, strict=True):
            assert isinstance(answer, Task)
            stored = broker.get(twin.task.id)
            assert replace(stored, id=answer.id, created_at=answer.created_at, run_at=answer.run_at) == answer
            assert (stored.status, stored.finished_at) == (Status.COMPLETED, clock.now())
        assert broker.get(quiet.task.id).result == b"\x00r"
        assert broker.get(quiet_none.task.id).result is None
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 4}}

    def test_a_quiet_ack_answers_stale_unknown_and_repeated_items_alone(self, broker: Broker) -> None:
        good, stale = claim_many(broker, 2)
        unknown = new_id()
        items = [ack_item(good, b"1"), (stale.task.id, "bad-token", b"x"), (unknown, "t", None)]
        answers = _quiet(broker).ack_many_quiet([*items, ack_item(good, b"2")])
        assert answers[0] is None
        assert isinstance(answers[1], LeaseLostError) and "another lease" in str(answers[1])
        assert isinstance(answers[2], TaskNotFoundError) and unknown in str(answers[2])
        assert isinstance(answers[3], LeaseLostError) and "completed" in str(answers[3])
        assert broker.get(good.task.id).result == b"1"
        untouched = broker.get(stale.task.id)
        assert (untouched.status, untouched.result) == (Status.RUNNING, None)

    def test_a_quiet_ack_of_a_reaped_lease_changes_nothing(self, broker: Broker, clock: ManualClock) -> None:
        (lease,) = claim_many(broker, 1)
        clock.advance(TTL)
        broker.reap(lease_lost_max=5)
        before = broker.get(lease.task.id)
        (answer,) = _quiet(broker).ack_many_quiet([ack_item(lease, b"late")])
        assert isinstance(answer, LeaseLostError)
        assert broker.get(lease.task.id) == before

    def test_a_quiet_ack_wakes_the_children_and_cancels_nothing(self, broker: Broker) -> None:
        one, two, three = claim_many(broker, 3, queue="parents")
        child = submit(broker, depends_on=(one.task.id, two.task.id))
        waiting = submit(broker, depends_on=(three.task.id,))
        assert _quiet(broker).ack_many_quiet([ack_item(one)]) == [None]
        assert broker.get(child.id).status is Status.BLOCKED
        assert _quiet(broker).ack_many_quiet([ack_item(two), ack_item(three)]) == [None, None]
        assert {broker.get(child.id).status, broker.get(waiting.id).status} == {Status.PENDING}
        assert {lease.task.id for lease in broker.claim("q", 10, TTL)} == {child.id, waiting.id}

    @pytest.mark.parametrize(("bad", "error"), BAD_ACK_ITEMS)
    def test_a_quiet_ack_refuses_bad_items_before_changing_anything(
        self, broker: Broker, bad: object, error: type[Exception]
    ) -> None:
        (lease,) = claim_many(broker, 1)
        items = [ack_item(lease), *bad] if isinstance(bad, list) else bad
        with pytest.raises(error):
            _quiet(broker).ack_many_quiet(items)  # type: ignore[arg-type]
        assert broker.get(lease.task.id).status is Status.RUNNING

    def test_a_quiet_ack_racing_ack_many_completes_each_task_exactly_once(
        self, broker_factory: BrokerFactory
    ) -> None:
        first, second = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            _race_quiet_against_loud(first, second, [ack_item(lease) for lease in claim_many(first, 4)])
            assert nonzero_counts(first)["t"].get(Status.RUNNING, 0) == 0


def _race_quiet_against_loud(first: Broker, second: Broker, items: list[AckItem]) -> None:
    """Ack ``items`` quietly from one broker and with `ack_many` from another, in opposite orders."""
    quiet, loud = race_pair(lambda: _quiet(first).ack_many_quiet(items), lambda: second.ack_many(items[::-1]))
    assert quiet.ok and loud.ok, (quiet.error, loud.error)
    answers = [*(quiet.value or []), *(loud.value or [])]
    assert sum(a is None or isinstance(a, Task) for a in answers) == len(items)
    assert sum(isinstance(a, LeaseLostError) for a in answers) == len(items)
