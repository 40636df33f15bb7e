"""Contract: a claim of some types (`Claim.types`) and the count of unhandled tasks.

A process claims only the types it has handlers for, so a task of a type it cannot run waits
for a process that can. A claim with ``types`` leases only tasks of those types, oldest due
first among them, however many due tasks of other types are older -- on every claim path
(plain, within a quota, under shared limits: units and slots are spent only for tasks
claimed). `QueueQuery.unhandled` counts a queue's ready tasks due for longer than ``after``
of a type not in ``handled``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskgate.brokers.base import Broker, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, QueueQuery, SharedLimits, Unhandled
from taskgate.clock import ManualClock
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import TTL, assert_refused, claim_one, new_task, submit

__all__ = ["ClaimTypesContract"]

# Due tasks of a type no claim asks for, older than the ones it asks for.
MANY = 5000
BUDGET = QuotaSpec("typed", 100, timedelta(hours=1))


def _ids(claimed: Claimed) -> list[str]:
    return [lease.task.id for lease in claimed.leases]


def _any(value: object) -> Any:
    """``value`` typed as anything: a call that passes what the signature forbids on purpose."""
    return value


def _claim(broker: Broker, limit: int, types: tuple[str, ...] | None, path: str, **shared: Any) -> Claimed:
    """A claim of queue "q" by ``path``: plain, within `BUDGET`, or under shared limits."""
    if path == "quota":
        return broker.claim(Claim("q", limit, TTL, quota=BUDGET, types=types))
    if path == "shared":
        limits = SharedLimits(shared.pop("workers", limit), **shared)
        return broker.claim(Claim("q", limit, TTL, shared=limits, types=types))
    return broker.claim(Claim("q", limit, TTL, types=types))


def _skip_without(broker: Broker, path: str) -> None:
    if path == "quota" and not broker.capabilities.shared_quota:
        pytest.skip("broker does not declare capabilities.shared_quota")
    if path == "shared" and not broker.capabilities.shared_limits:
        pytest.skip("broker does not declare capabilities.shared_limits")


class ClaimTypesContract:
    """`Claim.types` on every claim path, and `QueueQuery.unhandled`."""

    @pytest.mark.parametrize("path", ["plain", "quota", "shared"])
    def test_a_claim_of_some_types_leases_only_those_oldest_due_first(
        self, broker: Broker, clock: ManualClock, path: str
    ) -> None:
        _skip_without(broker, path)
        order = ["x", "a", "x", "b", "c", "a", "x"]
        ids = [f"t{i}-{kind}" for i, kind in enumerate(order)]
        for task_id, kind in zip(ids, order, strict=True):
            steps.enqueue(broker, [new_task(id=task_id, type=kind)])
            clock.advance(1)
        claimed = _claim(broker, 10, ("b", "a"), path)
        assert _ids(claimed) == ["t1-a", "t3-b", "t5-a"]
        assert {lease.task.status for lease in claimed.leases} == {Status.RUNNING}
        assert [t.id for t in broker.list(Filter(status=Status.PENDING))] == ["t0-x", "t2-x", "t4-c", "t6-x"]

    @pytest.mark.parametrize("path", ["plain", "quota", "shared"])
    def test_a_claim_of_some_types_finds_them_behind_thousands_of_older_due_tasks_of_others(
        self, broker: Broker, clock: ManualClock, path: str
    ) -> None:
        _skip_without(broker, path)
        steps.enqueue(broker, [new_task(type="new-type") for _ in range(MANY)])
        clock.advance(1)
        mine = [submit(broker, type="old-type").id for _ in range(2)]
        assert _ids(_claim(broker, 3, ("old-type",), path)) == mine
        assert steps.queue_length(broker, "q") == MANY

    def test_a_claim_without_types_leases_any_type(self, broker: Broker, clock: ManualClock) -> None:
        first = submit(broker, type="a")
        clock.advance(1)
        second = submit(broker, type="b")
        assert _ids(broker.claim(Claim("q", 5, TTL, types=None))) == [first.id, second.id]

    def test_a_claim_of_a_type_with_no_due_task_leases_nothing(self, broker: Broker) -> None:
        submit(broker, type="a")
        submit(broker, type="b", delay=timedelta(hours=1))
        assert _ids(broker.claim(Claim("q", 5, TTL, types=("b", "c")))) == []
        assert steps.queue_length(broker, "q") == 2

    def test_claim_types_are_kept_sorted_without_repeats(self) -> None:
        assert Claim("q", 1, TTL, types=_any(["b", "a", "b"])).types == ("a", "b")

    @pytest.mark.parametrize(
        ("types", "error"),
        [
            ((), ValueError),
            (("",), ValueError),
            (("a\x00b",), ValueError),
            (("x" * 256,), ValueError),
            ("a", TypeError),
            ((1,), TypeError),
            (b"a", TypeError),
        ],
    )
    def test_a_claim_with_bad_types_is_refused(self, types: object, error: type[Exception]) -> None:
        with pytest.raises(error, match=r"Claim\.types"):
            Claim("q", 1, TTL, types=_any(types))

    def test_a_claim_of_some_types_spends_units_only_for_what_it_leased(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        _skip_without(broker, "quota")
        steps.enqueue(broker, [new_task(type="other") for _ in range(3)])
        clock.advance(1)
        mine = submit(broker, type="mine")
        claimed = _claim(broker, 4, ("mine",), "quota")
        assert _ids(claimed) == [mine.id]
        assert claimed.quota is not None and claimed.quota.granted == 1
        usage = broker.queue_state(QueueQuery("q", BUDGET)).quota
        assert usage is not None and usage.used == 1

    def test_a_shared_claim_of_some_types_takes_slots_only_for_what_it_leased(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        one, two = broker_factory(), broker_factory()
        _skip_without(one, "shared")
        steps.enqueue(one, [new_task(type="other") for _ in range(3)])
        clock.advance(1)
        mine = submit(one, type="mine")
        assert _ids(_claim(one, 2, ("mine",), "shared", workers=2)) == [mine.id]
        assert len(_ids(_claim(two, 3, ("other",), "shared", workers=2))) == 1  # one slot was left

    def test_a_claimer_finding_no_slot_while_only_other_types_are_due_is_owed_none(
        self, broker_factory: BrokerFactory
    ) -> None:
        holder, typed = broker_factory(), broker_factory()
        _skip_without(holder, "shared")
        steps.enqueue(holder, [new_task(type="other") for _ in range(2)])
        (held,) = _claim(holder, 1, None, "shared", workers=1, claimer="holder").leases
        assert _ids(_claim(typed, 1, ("mine",), "shared", workers=1, claimer="typed")) == []
        steps.ack(holder, held.task.id, held.token)
        # Had "typed" been noted as a waiter, the holder would leave the freed slot to it.
        again = _claim(holder, 1, None, "shared", workers=1, claimer="holder", release=(held.token,))
        assert len(again.leases) == 1

    def test_wait_for_work_answers_for_due_tasks_of_any_type(self, broker: Broker) -> None:
        # A type nobody claims still makes the queue's work due: the caller's poll interval,
        # not this answer, keeps it from asking again at once.
        submit(broker, type="unclaimed")
        assert broker.wait_for_work(["q"], 0) is True

    def test_queue_state_counts_due_tasks_of_unhandled_types_waiting_longer_than_after(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        submit(broker, type="handled")
        submit(broker, type="new")
        submit(broker, type="newer")
        submit(broker, type="new", delay=timedelta(minutes=5))
        running = submit(broker, type="gone")
        assert _ids(broker.claim(Claim("q", 1, TTL, types=("gone",)))) == [running.id]
        submit(broker, type="new", queue="other")
        clock.advance(60)
        submit(broker, type="new")  # due for less than `after`
        after = timedelta(seconds=30)

        def unhandled(*handled: str) -> int:
            return broker.queue_state(QueueQuery("q", unhandled=Unhandled(after, handled))).unhandled

        assert unhandled("handled") == 2
        assert unhandled("newer", "handled") == 1
        assert unhandled() == 3  # no handler at all: every type counts
        clock.advance(timedelta(minutes=5))
        assert unhandled("handled") == 4

    def test_queue_state_without_unhandled_answers_zero_and_with_it_keeps_the_rest(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        submit(broker, type="a")
        clock.advance(60)
        plain = broker.queue_state(QueueQuery("q"))
        counted = broker.queue_state(QueueQuery("q", unhandled=Unhandled(timedelta(seconds=1))))
        assert (plain.queue_len, plain.unhandled) == (1, 0)
        assert (counted.queue_len, counted.quota, counted.unhandled) == (1, None, 1)
        if broker.capabilities.shared_quota:
            both = broker.queue_state(QueueQuery("q", BUDGET, Unhandled(timedelta(seconds=1), ("a",))))
            assert both.queue_len == 1 and both.unhandled == 0
            assert both.quota is not None and both.quota.used == 0

    @pytest.mark.parametrize(
        ("fields", "error"),
        [
            ({"after": timedelta(seconds=-1)}, ValueError),
            ({"after": 5}, TypeError),
            ({"handled": "a"}, TypeError),
            ({"handled": ("",)}, ValueError),
        ],
    )
    def test_a_bad_unhandled_query_is_refused(self, fields: dict[str, Any], error: type[Exception]) -> None:
        with pytest.raises(error, match="Unhandled"):
            Unhandled(**{"after": timedelta(0), **fields})

    def test_a_refused_typed_claim_changes_nothing(self, broker: Broker) -> None:
        submit(broker, type="a")
        if broker.capabilities.shared_limits:
            return
        claim = Claim("q", 1, TTL, shared=SharedLimits(1), types=("a",))
        assert_refused(broker, lambda: broker.claim(claim), "shared")
        assert claim_one(broker).task.type == "a"
