"""Contract: reads -- counts, list filters and paging, business keys and history (a queue's
length and quota figures: `queue_state`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.clock import ManualClock
from taskgate.errors import TaskExistsError
from taskgate.task import Filter, Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, new_task, nonzero_counts, submit

__all__ = ["BusinessKeyContract", "ReadContract"]


def _mixed_history(broker: Broker, clock: ManualClock) -> None:
    """Tasks of two types in every status, each reached through a real transition."""
    for task_type in ("alpha", "beta"):
        parent = submit(broker, type=task_type, queue=f"{task_type}-work")
        submit(broker, type=task_type, queue="side", depends_on=(parent.id,))
        for _ in range(4):
            submit(broker, type=task_type, queue=f"{task_type}-work")
        leases = steps.claim(broker, f"{task_type}-work", 4, TTL)
        steps.ack(broker, leases[1].task.id, leases[1].token, None)
        steps.fail(broker, leases[2].task.id, leases[2].token, kind=FailureKind.BUSINESS, error="x")
        steps.retry(
            broker, leases[3].task.id, leases[3].token, kind=FailureKind.THROTTLED, error="x", delay=TTL
        )
        broker.cancel(submit(broker, type=task_type).id)
        clock.advance(1)


def _counted(tasks: list[Task]) -> dict[str, dict[Status, int]]:
    tally = Counter((t.type, t.status) for t in tasks)
    result: dict[str, dict[Status, int]] = {}
    for (task_type, status), n in tally.items():
        result.setdefault(task_type, {})[status] = n
    return result


class ReadContract:
    """Counts and lists (seed: CountsConsistency, ListFilter, ListPagination)."""

    def test_counts_of_an_empty_broker_are_empty(self, broker: Broker) -> None:
        assert nonzero_counts(broker) == {}

    def test_counts_match_what_list_shows_after_mixed_transitions(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        _mixed_history(broker, clock)
        tasks = broker.list(Filter())
        assert nonzero_counts(broker) == _counted(tasks)
        assert {t.status for t in tasks} == set(Status)

    def test_counts_follow_each_transition(self, broker: Broker) -> None:
        task = submit(broker)
        assert nonzero_counts(broker) == {"t": {Status.PENDING: 1}}
        lease = claim_one(broker)
        assert nonzero_counts(broker) == {"t": {Status.RUNNING: 1}}
        steps.ack(broker, task.id, lease.token, None)
        assert nonzero_counts(broker) == {"t": {Status.COMPLETED: 1}}

    def test_list_without_filter_returns_everything_in_creation_order(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        ids = []
        for _ in range(3):
            ids.append(submit(broker).id)
            clock.advance(1)
        assert [t.id for t in broker.list(Filter())] == ids

    def test_list_breaks_created_at_ties_by_id(self, broker: Broker) -> None:
        steps.enqueue(broker, [new_task(id=i) for i in ("id-c", "id-a", "id-b")])
        assert [t.id for t in broker.list(Filter())] == ["id-a", "id-b", "id-c"]

    def test_list_returns_current_snapshots(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        assert broker.list(Filter()) == [lease.task]
        assert broker.list(Filter())[0] == broker.get(task.id)

    @pytest.mark.parametrize(
        ("field", "value"),
        [("type", "alpha"), ("queue", "side"), ("status", Status.RETRYING), ("status", Status.BLOCKED)],
    )
    def test_list_filters_by_one_field(
        self, broker: Broker, clock: ManualClock, field: str, value: Any
    ) -> None:
        _mixed_history(broker, clock)
        everything = broker.list(Filter())
        expected = [t.id for t in everything if getattr(t, field) == value]
        assert expected
        assert [t.id for t in broker.list(Filter(**{field: value}))] == expected

    def test_list_of_running_tasks_follows_claims_acks_reaps_and_retries(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        # Some brokers keep no status index of their own for running tasks (Redis lists them
        # from its leases): every way in and out of running must show in the list.
        created = {}
        for n in range(6):
            task = submit(broker, type=("alpha", "beta")[n % 2], queue=("q1", "q2")[n // 3])
            created[task.id] = task
            clock.advance(1)
        # The later-created tasks are claimed first: lease ends run against creation order.
        in_q2 = steps.claim(broker, "q2", 3, TTL)
        clock.advance(TTL.total_seconds() - 1)
        in_q1 = steps.claim(broker, "q1", 3, TTL)  # outlives the first three's leases

        def running(**fields: Any) -> list[str]:
            return [t.id for t in broker.list(Filter(status=Status.RUNNING, **fields))]

        def in_creation_order(ids: set[str]) -> list[str]:
            return sorted(ids, key=lambda i: (created[i].created_at, i))

        everything = in_creation_order({lease.task.id for lease in in_q1 + in_q2})
        assert running() == everything
        assert running(type="alpha") == [i for i in everything if created[i].type == "alpha"]
        assert running(queue="q2", type="beta") == [
            i for i in everything if created[i].queue == "q2" and created[i].type == "beta"
        ]
        assert running(limit=2, offset=3) == everything[3:5]

        steps.ack(broker, in_q1[0].task.id, in_q1[0].token, None)
        steps.retry(broker, in_q1[1].task.id, in_q1[1].token, kind=FailureKind.BUSINESS, error="x", delay=TTL)
        clock.advance(2)
        reaped = {t.id for t in broker.reap(lease_lost_max=5)}
        assert reaped == {lease.task.id for lease in in_q2}
        assert running() == [in_q1[2].task.id]
        assert running(queue="q2") == []
        assert [t.status for t in broker.list(Filter(queue="q2"))] == [Status.PENDING] * 3

    def test_list_combines_filters(self, broker: Broker, clock: ManualClock) -> None:
        _mixed_history(broker, clock)
        found = broker.list(Filter(type="beta", status=Status.PENDING, queue="beta-work"))
        assert len(found) == 1
        assert (found[0].type, found[0].status, found[0].queue) == ("beta", Status.PENDING, "beta-work")

    def test_list_filters_by_business_key(self, broker: Broker) -> None:
        keyed = submit(broker, business_key="k-1")
        submit(broker, business_key="k-2")
        submit(broker)
        assert broker.list(Filter(business_key="k-1")) == [keyed]

    def test_ids_and_types_differing_only_by_trailing_spaces_are_distinct(self, broker: Broker) -> None:
        plain = submit(broker, id="task-1", type="t")
        padded = submit(broker, id="task-1 ", type="t ")
        assert (broker.get("task-1"), broker.get("task-1 ")) == (plain, padded)
        assert broker.list(Filter(type="t")) == [plain]
        assert nonzero_counts(broker) == {"t": {Status.PENDING: 1}, "t ": {Status.PENDING: 1}}

    def test_list_of_no_match_is_empty(self, broker: Broker) -> None:
        submit(broker)
        assert broker.list(Filter(type="nothing-like-this")) == []

    def test_list_pages_are_stable_and_cover_everything(self, broker: Broker, clock: ManualClock) -> None:
        for n in range(7):
            submit(broker)
            if n % 3 == 0:
                clock.advance(1)
        everything = [t.id for t in broker.list(Filter())]
        pages = [broker.list(Filter(limit=2, offset=offset)) for offset in range(0, 8, 2)]
        assert [len(p) for p in pages] == [2, 2, 2, 1]
        assert [t.id for page in pages for t in page] == everything

    def test_list_offset_past_the_end_is_empty(self, broker: Broker) -> None:
        submit(broker)
        assert broker.list(Filter(offset=1)) == []
        assert broker.list(Filter(offset=50, limit=5)) == []

    def test_list_limit_zero_means_all(self, broker: Broker) -> None:
        for _ in range(4):
            submit(broker)
        assert len(broker.list(Filter(limit=0, offset=1))) == 3

    def test_list_filters_by_parent_alone_and_with_other_fields(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        parent, other = submit(broker, id="p"), submit(broker, id="o")
        clock.advance(1)
        steps.enqueue(
            broker,
            [
                new_task(id="c2", depends_on=("p",), group="g"),
                new_task(id="c1", depends_on=("p", "o", "p"), type="u"),  # named twice, listed once
                new_task(id="only-o", depends_on=("o",)),
            ],
        )
        clock.advance(1)
        late = steps.enqueue(broker, [new_task(id="c0", depends_on=("p",))])[0]
        assert [t.id for t in broker.list(Filter(parent=parent.id))] == ["c1", "c2", late.id]
        assert [t.id for t in broker.list(Filter(parent=parent.id, type="u"))] == ["c1"]
        assert [t.id for t in broker.list(Filter(parent=parent.id, group="g"))] == ["c2"]
        assert [t.id for t in broker.list(Filter(parent=parent.id, limit=1, offset=1))] == ["c2"]
        assert [t.id for t in broker.list(Filter(parent=other.id))] == ["c1", "only-o"]
        assert [t.id for t in broker.list(Filter(parent=parent.id, status=Status.BLOCKED))] == [
            "c1",
            "c2",
            "c0",
        ]
        assert broker.list(Filter(parent="nobody")) == []
        assert broker.list(Filter(parent=late.id)) == []


class BusinessKeyContract:
    """Business keys make submission idempotent (seed: BusinessKeyIdempotent, BusinessKeyQuery)."""

    def test_second_submit_of_a_key_raises_task_exists_naming_the_first(self, broker: Broker) -> None:
        first = submit(broker, business_key="order-7")
        with pytest.raises(TaskExistsError) as caught:
            submit(broker, business_key="order-7")
        error = caught.value
        assert (error.business_key, error.execution_id, error.status) == ("order-7", first.id, Status.PENDING)
        assert nonzero_counts(broker) == {"t": {Status.PENDING: 1}}

    def test_task_exists_reports_the_current_status(self, broker: Broker) -> None:
        first = submit(broker, business_key="order-8")
        steps.ack(broker, first.id, claim_one(broker).token, None)
        with pytest.raises(TaskExistsError) as caught:
            submit(broker, business_key="order-8")
        assert caught.value.status is Status.COMPLETED

    def test_task_exists_names_the_newest_execution_after_a_replay(self, broker: Broker) -> None:
        first = submit(broker, business_key="order-9")
        steps.fail(broker, first.id, claim_one(broker).token, kind=FailureKind.SKIP, error="x")
        newest = steps.replay(broker, first.id, new_id=new_task().id)
        with pytest.raises(TaskExistsError) as caught:
            submit(broker, business_key="order-9")
        assert (caught.value.execution_id, caught.value.status) == (newest.id, Status.PENDING)

    def test_a_used_key_in_a_batch_stores_nothing_of_the_batch(self, broker: Broker) -> None:
        submit(broker, business_key="dup")
        fresh = new_task(business_key="fresh")
        with pytest.raises(TaskExistsError):
            steps.enqueue(broker, [fresh, new_task(business_key="dup")])
        assert steps.history(broker, "fresh") == []
        assert len(broker.list(Filter())) == 1

    def test_different_keys_do_not_collide(self, broker: Broker) -> None:
        submit(broker, business_key="a")
        submit(broker, business_key="b")
        assert len(broker.list(Filter())) == 2

    def test_keys_differing_only_by_trailing_spaces_are_distinct(self, broker: Broker) -> None:
        # Keys compare exactly: a PAD SPACE collation (MySQL's utf8mb4_bin) took 'k ' for 'k'.
        plain = submit(broker, business_key="k")
        padded = submit(broker, business_key="k ")
        assert steps.history(broker, "k") == [plain]
        assert steps.history(broker, "k ") == [padded]
        assert steps.history(broker, "k  ") == []
        assert broker.list(Filter(business_key="k")) == [plain]
        with pytest.raises(TaskExistsError) as caught:
            submit(broker, business_key="k ")
        assert (caught.value.business_key, caught.value.execution_id) == ("k ", padded.id)

    def test_history_of_an_unknown_key_is_empty(self, broker: Broker) -> None:
        assert steps.history(broker, "never-used") == []

    def test_history_lists_every_execution_oldest_first(self, broker: Broker, clock: ManualClock) -> None:
        first = submit(broker, business_key="report")
        ids = [first.id]
        for _ in range(2):
            steps.fail(broker, ids[-1], claim_one(broker).token, kind=FailureKind.SKIP, error="x")
            clock.advance(1)
            ids.append(steps.replay(broker, ids[-1], new_id=new_task().id).id)
        history = steps.history(broker, "report")
        assert [t.id for t in history] == ids
        assert [t.replay_of for t in history] == [None, ids[0], ids[1]]
        assert history[-1] == broker.get(ids[-1])
