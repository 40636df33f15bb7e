"""Contract: a queue's limits shared by every process -- ``Claim(shared=SharedLimits(...))``.

Where a broker declares ``capabilities.shared_limits``, these cases hold it to the limits:
each lease holds one of ``workers`` slots under its token (given back by
``Settle(give_back=GiveBack(queue=..., slots=...))`` or ``SharedLimits.release``, renewed by a
``Heartbeat`` with ``slot_queue``, expiring with the lease); ``rps``/``burst`` holds starts
back, answering ``Claimed.retry_after``; ``claimer`` ids take turns at freed slots. Where it
also declares ``capabilities.group_limits``, each group of the queue is held to its own
``group_*`` limits, and a group at its limit never holds up another; where it does not, a claim
setting them is refused naming the field.

Where it does not, the SAME cases hold it to the refusal instead: the case's first call that
needs the capability -- a `Claim` with ``shared``, a `Heartbeat` with ``slot_queue``, a
`GiveBack` with slots -- raises `ValueError` naming the field and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from taskgate.brokers.base import Broker, Lease, QuotaSpec
from taskgate.brokers.params import (
    HELD_INDEFINITELY,
    Claim,
    Claimed,
    Complete,
    GiveBack,
    Heartbeat,
    Hold,
    QueueQuery,
    Renewal,
    Settle,
    SharedLimits,
)
from taskgate.clock import ManualClock
from taskgate.task import Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    RACE_ROUNDS,
    TTL,
    assert_refused,
    claim_one,
    new_task,
    nonzero_counts,
    race,
)

__all__ = ["SharedLimitsContract"]

MICROSECOND = timedelta(microseconds=1)
CLAIMERS = 8
WORKERS = 5


def _pending(broker: Broker, n: int, queue: str = "q") -> list[str]:
    """``n`` tasks of ``queue``, due now; their ids in claim order."""
    ids = [f"{queue}-{i:02}" for i in range(n)]
    steps.enqueue(broker, [new_task(id=task_id, queue=queue) for task_id in ids])
    return ids


def _ids(claimed: Claimed | None) -> list[str]:
    assert claimed is not None
    return [lease.task.id for lease in claimed.leases]


def _limited(
    broker: Broker,
    limit: int,
    workers: int,
    *,
    queue: str = "q",
    rps: float = 0.0,
    burst: int = 0,
    release: tuple[str, ...] = (),
    claimer: str = "",
) -> Claimed | None:
    """A claim of ``queue`` under these `SharedLimits`.

    On a broker without ``shared_limits``: asserts the claim is refused, naming the field and
    changing nothing, and answers None -- the case then ends there.
    """
    claim = Claim(queue, limit, TTL, shared=SharedLimits(workers, rps, burst, release, claimer))
    if broker.capabilities.shared_limits:
        return broker.claim(claim)
    assert_refused(broker, lambda: broker.claim(claim), "shared")
    return None


def _in_groups(broker: Broker, groups: Sequence[str | None], queue: str = "q") -> list[str]:
    """One task per entry of ``groups`` (None: no group), due now; their ids in claim order."""
    ids = [f"{queue}-{i:02}-{group or 'none'}" for i, group in enumerate(groups)]
    items = [
        new_task(id=task_id, queue=queue, group=group) for task_id, group in zip(ids, groups, strict=True)
    ]
    steps.enqueue(broker, items)
    return ids


def _grouped(
    broker: Broker,
    limit: int,
    *,
    workers: int = 20,
    release: tuple[str, ...] = (),
    quota: QuotaSpec | None = None,
    **group_limits: Any,
) -> Claimed | None:
    """A claim of queue "q" under ``workers`` slots and these group limits.

    On a broker without ``group_limits`` (or without shared limits at all): asserts the claim
    is refused naming the field, changing nothing, and answers None -- the case ends there.
    """
    shared = SharedLimits(workers, release=release, **group_limits)
    claim = Claim("q", limit, TTL, quota=quota, shared=shared)
    if broker.capabilities.shared_limits and broker.capabilities.group_limits:
        return broker.claim(claim)
    assert_refused(
        broker, lambda: broker.claim(claim), "group" if broker.capabilities.shared_limits else "shared"
    )
    return None


def _to_next(clock: ManualClock, period: timedelta) -> timedelta:
    """How far ``clock`` is from the start of the next epoch-aligned window of ``period``."""
    elapsed = clock.now() - datetime(1970, 1, 1, tzinfo=UTC)
    return period - elapsed % period


def _leases(claimed: Claimed | None) -> list[Lease]:
    assert claimed is not None
    return claimed.leases


def _give_back(broker: Broker, *leases: Lease, complete: bool = True) -> list[Task]:
    """Complete ``leases`` (unless told not to) and give their slots back, in one settle."""
    items = tuple(Complete(lease.task.id, lease.token) for lease in leases) if complete else ()
    give_back = GiveBack(queue="q", slots=tuple(lease.token for lease in leases))
    answers = broker.settle(Settle(items, give_back=give_back))
    assert all(isinstance(a, Task) for a in answers), answers
    return [a for a in answers if isinstance(a, Task)]


def _slot_heartbeat(broker: Broker, lease: Lease) -> Renewal:
    return broker.heartbeat(Heartbeat(lease.task.id, lease.token, TTL, slot_queue="q"))


class SharedLimitsContract:
    """Shared slots, rate and turn-taking; or, without ``shared_limits``, their refusal."""

    def test_a_shared_claim_takes_a_slot_per_claimed_task_and_no_more(
        self, broker_factory: BrokerFactory
    ) -> None:
        one, two = broker_factory(), broker_factory()
        ids = _pending(one, 5)
        if (taken := _limited(one, 10, 3)) is None:
            return
        assert _ids(taken) == ids[:3]
        assert all(lease.task.status is Status.RUNNING for lease in taken.leases)
        assert _ids(_limited(two, 10, 3)) == []  # every slot is held, by any broker object
        assert two.get(ids[3]).status is Status.PENDING  # nothing claimed without a slot
        _give_back(one, taken.leases[0])
        assert _ids(_limited(two, 10, 3)) == [ids[3]]

    def test_a_shared_claim_takes_no_slot_when_nothing_is_due(self, broker: Broker) -> None:
        if _limited(broker, 2, 2) is None:
            return
        ids = _pending(broker, 2)
        assert _ids(_limited(broker, 2, 2)) == ids[:2]  # the empty claim held none

    def test_racing_claimers_never_hold_more_slots_than_workers(self, broker_factory: BrokerFactory) -> None:
        main = broker_factory()
        _pending(main, 1, queue="probe")
        if _limited(main, 1, WORKERS, queue="probe") is None:
            return
        claimers = [broker_factory() for _ in range(CLAIMERS)]

        def claim_until_none_left(broker: Broker, queue: str) -> list[str]:
            ids: list[str] = []
            while taken := _ids(_limited(broker, 2, WORKERS, queue=queue)):
                ids += taken
            return ids

        for round_no in range(RACE_ROUNDS):
            queue = f"crowded-{round_no}"
            _pending(main, 3 * WORKERS, queue=queue)
            outcomes = race([partial(claim_until_none_left, b, queue) for b in claimers])
            assert all(o.ok for o in outcomes), [o.error for o in outcomes]
            claimed = [task_id for o in outcomes for task_id in o.value or []]
            assert len(claimed) == len(set(claimed)) == WORKERS
            assert steps.queue_length(main, queue) == 2 * WORKERS

    def test_a_slot_given_back_by_a_settle_frees_it_once(self, broker: Broker) -> None:
        ids = _pending(broker, 3)
        if not broker.capabilities.shared_limits:
            lease = claim_one(broker)
            settle = Settle(
                (Complete(lease.task.id, lease.token),), give_back=GiveBack(queue="q", slots=(lease.token,))
            )
            assert_refused(broker, lambda: broker.settle(settle), "slot")  # the Complete is not written
            return
        (mine,) = _leases(_limited(broker, 1, 1))
        assert _ids(_limited(broker, 1, 1)) == []
        (done,) = _give_back(broker, mine)
        assert done.status is Status.COMPLETED
        taken = _limited(broker, 1, 1)
        assert _ids(taken) == [ids[1]]
        _give_back(broker, mine, complete=False)  # a late duplicate must not free theirs
        assert _ids(_limited(broker, 1, 1)) == []
        assert taken is not None and _slot_heartbeat(broker, taken.leases[0]).slot_lost is False

    def test_slots_expire_with_the_lease(self, broker: Broker, clock: ManualClock) -> None:
        ids = _pending(broker, 2)
        if (taken := _limited(broker, 1, 1)) is None:
            return
        assert [lease.expires_at for lease in taken.leases] == [clock.now() + TTL]
        clock.advance(TTL - MICROSECOND)
        assert _ids(_limited(broker, 1, 1)) == []
        clock.advance(MICROSECOND)  # the crashed holder's slot comes back
        assert _ids(_limited(broker, 1, 1)) == [ids[1]]

    def test_a_heartbeat_with_slot_queue_renews_the_slot_with_the_lease(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        _pending(broker, 2)
        if not broker.capabilities.shared_limits:
            lease = claim_one(broker)
            assert_refused(broker, lambda: _slot_heartbeat(broker, lease), "slot.queue")
            clock.advance(TTL)  # the refused heartbeat did not extend the lease either
            assert [t.id for t in broker.reap(lease_lost_max=5)] == [lease.task.id]
            return
        (lease,) = _leases(_limited(broker, 1, 1))
        clock.advance(TTL - timedelta(seconds=1))
        renewal = _slot_heartbeat(broker, lease)
        assert (renewal.expires_at, renewal.cancel_requested, renewal.slot_lost) == (
            clock.now() + TTL,
            False,
            False,
        )
        clock.advance(timedelta(seconds=2))  # past the first lease's end: the slot is still held
        assert _ids(_limited(broker, 1, 1)) == []

    def test_a_heartbeat_answers_slot_lost_for_a_slot_given_back_or_expired(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        _pending(broker, 3)
        if (taken := _limited(broker, 2, 2)) is None:
            return
        given_back, expired = taken.leases
        _give_back(broker, given_back, complete=False)
        assert _slot_heartbeat(broker, given_back).slot_lost is True
        clock.advance(TTL)  # the lease ran out, and its slot with it; no reaper came yet
        renewal = _slot_heartbeat(broker, expired)
        assert (renewal.slot_lost, renewal.expires_at) == (True, clock.now() + TTL)
        assert broker.get(expired.task.id).status is Status.RUNNING

    def test_the_rate_holds_starts_back_and_says_for_how_long(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        ids = _pending(broker, 12)
        if (taken := _limited(broker, 10, 10, rps=2.0, burst=3)) is None:
            return
        assert _ids(taken) == ids[:3]
        assert 0 < taken.retry_after <= 0.5
        held = _limited(broker, 10, 10, rps=2.0, burst=3)
        assert held is not None and held.leases == [] and 0 < held.retry_after <= 0.5
        assert broker.get(ids[3]).status is Status.PENDING
        clock.advance(held.retry_after)
        again = _limited(broker, 10, 10, rps=2.0, burst=3)
        assert again is not None and _ids(again) == ids[3:4] and again.retry_after > 0
        # The rate held tasks back, not the slots: only the four claimed tasks hold one.
        assert _ids(_limited(broker, 10, 10)) == ids[4:10]

    def test_starts_are_spent_only_for_tasks_claimed(self, broker: Broker) -> None:
        ids = _pending(broker, 2)
        if (taken := _limited(broker, 10, 10, rps=2.0, burst=3)) is None:
            return
        assert (_ids(taken), taken.retry_after) == (ids[:2], 0.0)  # no task was held back
        steps.enqueue(broker, [new_task(id=f"u{n}") for n in range(3)])
        rest = _limited(broker, 10, 10, rps=2.0, burst=3)
        assert rest is not None and _ids(rest) == ["u0"] and rest.retry_after > 0  # the burst's third

    def test_no_start_is_spent_without_a_free_slot(self, broker: Broker) -> None:
        ids = _pending(broker, 3)
        if (holder := _limited(broker, 1, 1)) is None:
            return
        refused = _limited(broker, 1, 1, rps=1.0, burst=1)
        assert refused is not None and (refused.leases, refused.retry_after) == ([], 0.0)
        _give_back(broker, *holder.leases)
        assert _ids(_limited(broker, 1, 1, rps=1.0, burst=1)) == [ids[1]]  # the start was still there

    def test_slots_released_by_a_claim_count_as_free_for_it(self, broker: Broker) -> None:
        ids = _pending(broker, 4)
        if (first := _limited(broker, 2, 2)) is None:
            return
        assert _ids(first) == ids[:2]
        assert _ids(_limited(broker, 2, 2)) == []  # both slots held
        done = tuple(lease.token for lease in first.leases)
        assert _ids(_limited(broker, 2, 2, release=done)) == ids[2:4]

    def test_a_claim_giving_back_more_slots_than_it_takes_frees_the_rest(
        self, broker_factory: BrokerFactory
    ) -> None:
        one, two = broker_factory(), broker_factory()
        ids = _pending(one, 5)
        if (first := _limited(one, 3, 3)) is None:
            return
        done = tuple(lease.token for lease in first.leases)
        assert _ids(_limited(one, 1, 3, release=done)) == ids[3:4]
        assert _ids(_limited(two, 3, 3)) == ids[4:5]  # two of the three came free
        assert _ids(_limited(one, 3, 3)) == []

    def test_a_slot_that_expired_and_was_taken_is_not_given_to_its_old_holder(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        one, two = broker_factory(), broker_factory()
        ids = _pending(one, 3)
        if (stale := _limited(one, 1, 1)) is None:
            return
        clock.advance(TTL)  # the holder stalled: its slot ran out with its lease
        (theirs,) = _leases(_limited(two, 1, 1))
        assert theirs.task.id == ids[1]
        assert _ids(_limited(one, 1, 1, release=(stale.leases[0].token,))) == []
        assert _slot_heartbeat(two, theirs).slot_lost is False

    def test_acks_and_released_slots_ride_on_one_shared_claim(self, broker: Broker) -> None:
        ids = _pending(broker, 4)
        if not broker.capabilities.shared_limits:
            leases = steps.claim(broker, "q", 2, TTL)
            acks = tuple(Complete(lease.task.id, lease.token, b"r") for lease in leases)
            shared = SharedLimits(2, release=tuple(lease.token for lease in leases))
            assert_refused(
                broker, lambda: broker.claim(Claim("q", 2, TTL, shared=shared, acks=acks)), "shared"
            )
            return
        first = _limited(broker, 2, 2)
        assert first is not None
        acks = tuple(Complete(lease.task.id, lease.token, b"r") for lease in first.leases)
        shared = SharedLimits(2, release=tuple(lease.token for lease in first.leases))
        claimed = broker.claim(Claim("q", 2, TTL, shared=shared, acks=acks))
        assert (claimed.acked, _ids(claimed)) == ([None, None], ids[2:4])
        assert [broker.get(task_id).result for task_id in ids[:2]] == [b"r", b"r"]
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 2, Status.RUNNING: 2}}
        assert _ids(_limited(broker, 2, 2)) == []

    def test_shared_limits_spend_quota_units_only_for_tasks_claimed(self, broker: Broker) -> None:
        ids = _pending(broker, 4)
        quota = QuotaSpec("api", 2, timedelta(minutes=1))
        limited = Claim("q", 10, TTL, quota=quota, shared=SharedLimits(4))
        if not broker.capabilities.shared_limits:
            assert_refused(broker, lambda: broker.claim(limited), "shared")
            assert len(broker.claim(Claim("q", 10, TTL, quota=quota)).leases) == 2  # no unit was spent
            return
        first = broker.claim(limited)
        assert _ids(first) == ids[:2]
        assert first.quota is not None and (first.quota.granted, first.exhausted) == (2, False)
        empty = broker.claim(limited)
        assert (empty.leases, empty.exhausted) == ([], True)
        assert _ids(_limited(broker, 10, 4)) == ids[2:4]  # the refused claim held no slot

    def test_claimers_take_turns_at_slots_given_back(self, broker: Broker) -> None:
        ids = _pending(broker, 4)
        if (held := _limited(broker, 1, 1, claimer="a")) is None:
            return
        assert _ids(_limited(broker, 1, 1, claimer="b")) == []  # b is owed a slot
        # a's task is done: its slot goes back, but is left for b instead of being taken again.
        released = (held.leases[0].token,)
        assert _ids(_limited(broker, 1, 1, release=released, claimer="a")) == []
        b_turn = _limited(broker, 1, 1, claimer="b")
        assert _ids(b_turn) == [ids[1]]
        # b got its turn and is struck off; a, which found no slot, is owed the next one.
        assert b_turn is not None
        released = (b_turn.leases[0].token,)
        assert _ids(_limited(broker, 1, 1, release=released, claimer="b")) == []
        assert _ids(_limited(broker, 1, 1, claimer="a")) == [ids[2]]

    def test_waiters_get_freed_slots_first_come_first_served(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        ids = _pending(broker, 4)
        if (held := _limited(broker, 1, 1, claimer="h")) is None:
            return
        assert _ids(_limited(broker, 1, 1, claimer="early")) == []
        clock.advance(MICROSECOND)  # noted later than "early"
        assert _ids(_limited(broker, 1, 1, claimer="late")) == []
        # h gives its slot back and leaves it to the two waiters (and is noted after them).
        assert _ids(_limited(broker, 1, 1, release=(held.leases[0].token,), claimer="h")) == []
        assert _ids(_limited(broker, 1, 1, claimer="late")) == []  # "early" was there first
        assert _ids(_limited(broker, 1, 1, claimer="h")) == []  # so were both waiters
        assert _ids(_limited(broker, 1, 1, claimer="early")) == [ids[1]]

    def test_a_claimer_that_never_comes_back_is_owed_a_slot_for_one_lease_ttl_only(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        ids = _pending(broker, 3)
        if (held := _limited(broker, 1, 1, claimer="a")) is None:
            return
        assert _ids(_limited(broker, 1, 1, claimer="gone")) == []
        assert _ids(_limited(broker, 1, 1, release=(held.leases[0].token,), claimer="a")) == []
        clock.advance(TTL)
        assert _ids(_limited(broker, 1, 1, claimer="a")) == [ids[1]]

    def test_without_a_claimer_id_a_claim_takes_every_free_slot(self, broker: Broker) -> None:
        ids = _pending(broker, 3)
        if (held := _limited(broker, 1, 1)) is None:
            return
        assert _ids(_limited(broker, 1, 1, claimer="b")) == []
        assert _ids(_limited(broker, 1, 1, release=(held.leases[0].token,))) == [ids[1]]

    # -- groups ------------------------------------------------------------------------------

    def test_a_group_at_its_workers_limit_is_passed_over_for_the_others(self, broker: Broker) -> None:
        ids = _in_groups(broker, ["a", "a", "a", "b", None, "b"])
        if (first := _grouped(broker, 10, group_workers=1)) is None:
            return
        assert _ids(first) == [ids[0], ids[3], ids[4]]  # one of a, one of b, and the ungrouped one
        assert [lease.task.group for lease in first.leases] == ["a", "b", None]
        assert _ids(_grouped(broker, 10, group_workers=1)) == []
        _give_back(broker, first.leases[0])  # a's slot comes free: a's next task, not b's
        assert _ids(_grouped(broker, 10, group_workers=1)) == [ids[1]]

    def test_a_full_group_ahead_of_many_tasks_never_hides_another(self, broker: Broker) -> None:
        ids = _in_groups(broker, ["a"] * 40 + ["b", "b"])
        if (first := _grouped(broker, 3, group_workers=1)) is None:
            return
        assert _ids(first) == [ids[0], ids[40]]  # past a's 39 waiting tasks; b's second must wait
        assert all(broker.get(task_id).status is Status.PENDING for task_id in ids[1:40])

    def test_a_full_group_a_thousand_tasks_deep_never_hides_another(self, broker: Broker) -> None:
        # Ids padded to sort in submit order: the claim order of tasks due at the same time.
        ahead = [new_task(id=f"a-{i:04}", group="a") for i in range(1000)]
        behind = [new_task(id=f"{g}-0", group=g) for g in "bc"] + [new_task(id="d-0", type="u", group="d")]
        steps.enqueue(broker, [*ahead, *behind])
        if (first := _grouped(broker, 2, group_workers=1)) is None:
            return
        assert _ids(first) == ["a-0000", "b-0"]
        shared = SharedLimits(20, group_workers=1)  # a claim of some types walks as far:
        assert _ids(broker.claim(Claim("q", 2, TTL, shared=shared, types=("t",)))) == ["c-0"]
        assert _ids(broker.claim(Claim("q", 2, TTL, shared=shared, types=("t", "u")))) == ["d-0"]
        assert broker.get("a-0999").status is Status.PENDING

    def test_a_group_limit_holds_across_claimers(self, broker_factory: BrokerFactory) -> None:
        one, two = broker_factory(), broker_factory()
        ids = _in_groups(one, ["a", "a", "a", "b"])
        if (first := _grouped(one, 1, group_workers=2)) is None:
            return
        assert _ids(first) == ids[:1]
        assert _ids(_grouped(two, 10, group_workers=2)) == [ids[1], ids[3]]

    def test_a_groups_expired_slot_comes_back(self, broker: Broker, clock: ManualClock) -> None:
        ids = _in_groups(broker, ["a", "a"])
        if _grouped(broker, 10, group_workers=1) is None:
            return
        clock.advance(TTL)  # the holder crashed: its slot, the group's, ran out with the lease
        assert _ids(_grouped(broker, 10, group_workers=1)) == [ids[1]]

    def test_a_group_rate_holds_its_own_starts_only(self, broker: Broker, clock: ManualClock) -> None:
        ids = _in_groups(broker, ["a", "a", "a", "b", "b"])
        if (first := _grouped(broker, 10, group_rps=1.0, group_burst=2)) is None:
            return
        assert _ids(first) == [ids[0], ids[1], ids[3], ids[4]]  # a burst of two for each group
        assert _ids(_grouped(broker, 10, group_rps=1.0, group_burst=2)) == []
        clock.advance(timedelta(seconds=1))
        assert _ids(_grouped(broker, 10, group_rps=1.0, group_burst=2)) == [ids[2]]

    def test_a_group_quota_counts_starts_per_window(self, broker: Broker, clock: ManualClock) -> None:
        minute = timedelta(minutes=1)
        limits: dict[str, Any] = {"group_quota_limit": 2, "group_quota_period": minute}
        ids = _in_groups(broker, ["a", "a", "a", "b"])
        if (first := _grouped(broker, 10, **limits)) is None:
            return
        assert _ids(first) == [ids[0], ids[1], ids[3]]
        _give_back(broker, *first.leases)  # slots are not the quota: a's window stays spent
        assert _ids(_grouped(broker, 10, **limits)) == []
        clock.advance(_to_next(clock, minute))
        assert _ids(_grouped(broker, 10, **limits)) == [ids[2]]

    def test_group_limits_spend_quota_units_only_for_tasks_claimed(self, broker: Broker) -> None:
        ids = _in_groups(broker, ["a", "a", "a"])
        quota = QuotaSpec("api", 10, timedelta(minutes=1))
        if (first := _grouped(broker, 10, quota=quota, group_workers=1)) is None:
            return
        assert _ids(first) == ids[:1]
        assert first.quota is not None and first.quota.granted == 1
        state = broker.queue_state(QueueQuery("q", quota))
        assert state.quota is not None and state.quota.used == 1  # none for a's passed-over tasks

    def test_group_limits_lease_nothing_from_a_held_queue(self, broker: Broker) -> None:
        ids = _in_groups(broker, ["a", "b"])
        if not (broker.capabilities.shared_limits and broker.capabilities.group_limits):
            assert _grouped(broker, 10, group_workers=1) is None  # refused, as every case says
            return
        broker.hold(Hold("q"))
        held = _grouped(broker, 10, group_workers=1)
        assert held is not None and (held.leases, held.held_until) == ([], HELD_INDEFINITELY)
        broker.hold(Hold("q", resume=True))
        assert _ids(_grouped(broker, 10, group_workers=1)) == ids

    def test_claims_handing_slots_over_or_limiting_groups_lease_only_their_types(
        self, broker: Broker
    ) -> None:
        steps.enqueue(broker, [new_task(id=f"o{n}", type="other", group="a") for n in range(3)])
        ids = [f"t{n}" for n in range(4)]
        steps.enqueue(
            broker, [new_task(id=task_id, type="t", group=f"g{n}") for n, task_id in enumerate(ids)]
        )
        if not broker.capabilities.shared_limits:
            return  # refused, as every case above shows
        first = broker.claim(Claim("q", 2, TTL, shared=SharedLimits(2), types=("t",)))
        assert _ids(first) == ids[:2]
        handing = SharedLimits(2, release=tuple(lease.token for lease in first.leases))
        assert _ids(broker.claim(Claim("q", 2, TTL, shared=handing, types=("t",)))) == ids[2:]
        if broker.capabilities.group_limits:
            grouped = SharedLimits(10, group_workers=1)
            assert _ids(broker.claim(Claim("q", 10, TTL, shared=grouped, types=("t",)))) == []
            assert _ids(broker.claim(Claim("q", 10, TTL, shared=grouped, types=("other",)))) == ["o0"]
