"""Contract: races forced with real threads and a barrier, each thread on its own broker.

Every test repeats its race `RACE_ROUNDS` times and checks the exact end state for whichever
side won. Brokers with connections get one broker object (so one connection) per thread.
"""

from __future__ import annotations

from functools import partial

from taskgate.brokers.base import Broker, FailureKind, Lease
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError, TaskExistsError
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import (
    RACE_ROUNDS,
    TTL,
    Outcome,
    claim_one,
    new_task,
    race,
    race_pair,
    submit,
)

__all__ = ["RaceContract"]

SUBMITTERS = 16
CLAIMERS = 8
CLAIM_BATCH = 3
TASKS_TO_CLAIM = 40
REAPED_TASKS = 6


def _claim_until_empty(broker: Broker, queue: str) -> list[str]:
    claimed: list[str] = []
    while leases := steps.claim(broker, queue, CLAIM_BATCH, TTL):
        assert len(leases) <= CLAIM_BATCH
        claimed.extend(lease.task.id for lease in leases)
    return claimed


class RaceContract:
    """Concurrent transitions (seed: IdentityRace, plus the fencing races)."""

    def test_reaper_racing_an_ack_has_exactly_one_winner(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, reaper, worker = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            task = submit(main)
            lease = claim_one(main)
            clock.advance(TTL)
            reaped, acked = race_pair(
                partial(reaper.reap, lease_lost_max=5), partial(steps.ack, worker, task.id, lease.token, b"r")
            )
            assert reaped.ok, reaped.error
            final = main.get(task.id)
            if acked.ok:
                assert reaped.value == []
                assert (final.status, final.lease_lost, final.result) == (Status.COMPLETED, 0, b"r")
            else:
                assert isinstance(acked.error, LeaseLostError)
                assert [t.id for t in reaped.value or []] == [task.id]
                assert (final.status, final.lease_lost, final.result) == (Status.PENDING, 1, None)
                main.cancel(task.id)

    def test_stale_worker_acking_after_a_reclaim_changes_nothing(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, stale_worker, new_worker = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            task = submit(main)
            stale = claim_one(main)
            clock.advance(TTL)
            main.reap(lease_lost_max=5)
            current = claim_one(main)
            old_ack, new_ack = race(
                [
                    partial(steps.ack, stale_worker, task.id, stale.token, b"stale"),
                    partial(steps.ack, new_worker, task.id, current.token, b"fresh"),
                ]
            )
            assert isinstance(old_ack.error, LeaseLostError)
            assert new_ack.ok, new_ack.error
            final = main.get(task.id)
            assert (final.status, final.result, final.lease_lost, final.claims) == (
                Status.COMPLETED,
                b"fresh",
                1,
                2,
            )

    def test_two_reapers_count_each_lost_lease_once(
        self, broker_factory: BrokerFactory, clock: ManualClock
    ) -> None:
        main, first, second = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            ids = {t.id for t in steps.enqueue(main, [new_task() for _ in range(REAPED_TASKS)])}
            steps.claim(main, "q", REAPED_TASKS, TTL)
            clock.advance(TTL)
            outcomes = race([partial(first.reap, lease_lost_max=5), partial(second.reap, lease_lost_max=5)])
            assert all(o.ok for o in outcomes), [o.error for o in outcomes]
            reaped = [t.id for o in outcomes for t in o.value or []]
            assert sorted(reaped) == sorted(ids)
            for task_id in ids:
                assert (main.get(task_id).lease_lost, main.get(task_id).status) == (1, Status.PENDING)
                main.cancel(task_id)

    def test_child_submitted_while_its_parent_completes_is_never_left_blocked(
        self, broker_factory: BrokerFactory
    ) -> None:
        main, worker, submitter = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            parent = submit(main, queue="parents")
            lease = claim_one(main, "parents")
            child = new_task(depends_on=(parent.id,))
            acked, submitted = race_pair(
                partial(steps.ack, worker, parent.id, lease.token, None),
                partial(steps.enqueue, submitter, [child]),
            )
            assert acked.ok and submitted.ok, (acked.error, submitted.error)
            assert main.get(child.id).status is Status.PENDING
            main.cancel(child.id)

    def test_child_submitted_while_its_parent_fails_is_never_left_blocked(
        self, broker_factory: BrokerFactory
    ) -> None:
        main, worker, submitter = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            parent = submit(main, queue="parents")
            lease = claim_one(main, "parents")
            child = new_task(depends_on=(parent.id,))
            failed, submitted = race_pair(
                partial(steps.fail, worker, parent.id, lease.token, kind=FailureKind.SKIP, error="x"),
                partial(steps.enqueue, submitter, [child]),
            )
            assert failed.ok and submitted.ok, (failed.error, submitted.error)
            assert main.get(child.id).status is Status.CANCELED

    def test_cancel_racing_a_claim_never_loses_the_cancel(self, broker_factory: BrokerFactory) -> None:
        main, canceler, claimer = broker_factory(), broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            task = submit(main)
            canceled, claimed = race_pair(
                partial(canceler.cancel, task.id), partial(steps.claim, claimer, "q", 1, TTL)
            )
            assert canceled.ok and claimed.ok, (canceled.error, claimed.error)
            _assert_cancel_kept(main, task.id, claimed)

    def test_one_of_many_submitters_of_a_business_key_wins(self, broker_factory: BrokerFactory) -> None:
        brokers = [broker_factory() for _ in range(SUBMITTERS)]
        for round_no in range(RACE_ROUNDS):
            key = f"identity-{round_no}"
            outcomes = race([partial(steps.enqueue, b, [new_task(business_key=key)]) for b in brokers])
            winners = [o.value[0] for o in outcomes if o.ok and o.value]
            assert len(winners) == 1, [o.error for o in outcomes]
            losers = [o.error for o in outcomes if not o.ok]
            assert len(losers) == SUBMITTERS - 1
            for error in losers:
                assert isinstance(error, TaskExistsError), error
                assert (error.business_key, error.execution_id) == (key, winners[0].id)
            assert [t.id for t in steps.history(brokers[0], key)] == [winners[0].id]

    def test_concurrent_claimers_take_each_task_exactly_once(self, broker_factory: BrokerFactory) -> None:
        main = broker_factory()
        claimers = [broker_factory() for _ in range(CLAIMERS)]
        for round_no in range(RACE_ROUNDS):
            queue = f"crowded-{round_no}"
            ids = {t.id for t in steps.enqueue(main, [new_task(queue=queue) for _ in range(TASKS_TO_CLAIM)])}
            outcomes = race([partial(_claim_until_empty, b, queue) for b in claimers])
            assert all(o.ok for o in outcomes), [o.error for o in outcomes]
            claimed = [task_id for o in outcomes for task_id in o.value or []]
            assert len(claimed) == len(set(claimed)) == TASKS_TO_CLAIM
            assert set(claimed) == ids
            assert steps.queue_length(main, queue) == 0
            assert len(main.list(Filter(queue=queue, status=Status.RUNNING))) == TASKS_TO_CLAIM


def _assert_cancel_kept(broker: Broker, task_id: str, claimed: Outcome[list[Lease]]) -> None:
    """Either the cancel came first (canceled, nothing claimed) or the holder sees the mark."""
    final = broker.get(task_id)
    leases = claimed.value or []
    if not leases:
        assert final.status is Status.CANCELED
        return
    (lease,) = leases
    assert (final.status, final.cancel_requested) == (Status.RUNNING, True)
    assert steps.heartbeat(broker, task_id, lease.token, TTL).cancel_requested is True
    steps.finish_canceled(broker, task_id, lease.token)
