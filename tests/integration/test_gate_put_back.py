"""Leases whose handlers never start go back as if never claimed, on every claim path.

A claim that answers after its deadline (or after its caller gave up), leases a shutdown or a
cancellation leaves unstarted: each task goes back to pending with no counter moved, its quota
unit back in its window and its shared slot free again. A handler that had started
keeps its unit (SPEC Part 1, shutdown).

On all five backends, each with the test's `ManualClock`: no lease expires and no quota
window ends meanwhile, so a lease that was not put back stays `running` for good (the test
fails), and the units left in the window count the handlers that started. `Late` wraps the
broker: the first claim carrying the chosen things (acks, a quota, shared limits) that leases
something (once armed) answers only when the test lets it -- after the runtime gave up on it.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from typing import Any

import anyio
import pytest
from gate_helpers import GUARD, carried, eventually, free_slots, make_gate, units_left

from taskgate import QueueConfig, Status, Task
from taskgate.brokers.base import Broker
from taskgate.brokers.params import Claim, Claimed, ItemAnswer, Requeue, Settle

pytestmark = pytest.mark.anyio

LIMIT = 50  # quota units per (never ending) window
PERIOD = timedelta(hours=1)
# A worker-path deadline of 0.15 s (lease_ttl / 4): a held call misses it soon.
SHORT_LEASE = 0.6


class Late:
    """A broker wrapper: once `armed`, the first claim carrying exactly ``carrying`` (see
    `carried`) that leases a task answers only when `answer` is set (in its own thread, after
    the real call); `held` is set then.

    Its calls always go to a thread. ``acks_ride`` decides whether acks may ride on claims
    (declared ``acks_in_claims`` or not, every broker takes them). `put_back` counts the
    requeues (what the runtime does with a lease nobody will start) per task.
    """

    def __init__(self, inner: Broker, carrying: frozenset[str], *, acks_ride: bool) -> None:
        self._inner = inner
        self.capabilities = dataclasses.replace(
            inner.capabilities,
            nonblocking=False,
            inline_attempts=False,
            split_calls=False,
            acks_in_claims=acks_ride,
        )
        self.carrying = carrying
        self.armed = True
        self.held, self.answer = threading.Event(), threading.Event()
        self.late_leased: list[str] = []
        self.claimed_meanwhile = threading.Event()  # a claim was made while the late one waited
        self.empty_claim = threading.Event()  # a claim found nothing (the queue is idle)
        self.put_back: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim(self, claim: Claim) -> Claimed:
        if self.held.is_set() and not self.answer.is_set():
            self.claimed_meanwhile.set()
        claimed = self._inner.claim(claim)
        leased = [lease.task.id for lease in claimed.leases]
        if not leased:
            self.empty_claim.set()
        with self._lock:
            hold = carried(claim) == self.carrying and self.armed and bool(leased) and not self.late_leased
            if hold:
                self.late_leased = leased
        if hold:
            self.held.set()
            self.answer.wait(GUARD)  # (a test that never answers fails on its own)
        return claimed

    def settle(self, settle: Settle) -> list[ItemAnswer]:
        answers = self._inner.settle(settle)
        with self._lock:
            for item in settle.items:
                if isinstance(item, Requeue):
                    self.put_back[item.task_id] = self.put_back.get(item.task_id, 0) + 1
        return answers


async def _units_left(broker: Broker) -> int:
    """Units left in queue "q"'s quota window (taking them: call it last)."""
    return await anyio.to_thread.run_sync(units_left, broker, "q", LIMIT, PERIOD)


async def _free_slots(broker: Broker, workers: int) -> int:
    """How many of queue "q"'s ``workers`` shared slots are free (taking them)."""
    return await anyio.to_thread.run_sync(free_slots, broker, "q", workers)


def _quota(workers: int, *, lease_ttl: float | str = "1h") -> QueueConfig:
    return QueueConfig(workers=workers, lease_ttl=lease_ttl, quota_limit=LIMIT, quota_period="1h")


# -- a claim of the scheduler that answers after its deadline --------------------------------

# (backend, what the held claim carries): every scheduler claim path -- with shared limits,
# which every backend keeps, so every claim counts the queue's workers across processes (on
# memory: across the broker's gates). Acks ride on claims only where the broker declares
# ``acks_in_claims``, but every broker's claim takes them.
_EXTRAS = ((), ("acks",), ("quota",), ("quota", "acks"))
BACKENDS = ("memory", "sqlite", "postgresql", "mysql", "redis")
SCHEDULER_PATHS = [(backend, frozenset({"shared", *extras})) for backend in BACKENDS for extras in _EXTRAS]


@pytest.mark.parametrize(
    ("backend", "carrying"),
    SCHEDULER_PATHS,
    ids=[f"{b}-{'+'.join(sorted(c)) or 'plain'}" for b, c in SCHEDULER_PATHS],
    indirect=["backend"],
)
async def test_a_claim_that_answers_after_its_deadline_puts_its_tasks_back(
    broker: Broker, backend: str, carrying: frozenset[str]
) -> None:
    # The scheduler gives up on the held claim (its deadline passes) and claims on; the held
    # call then answers, and its lease must go back with its unit and slot: no lease expires
    # here, so only putting it back runs that task. On a slow machine other claims may miss
    # their deadline too: each put-back costs its task one more claim and nothing else.
    late = Late(broker, carrying, acks_ride="acks" in carrying)
    with_quota = "quota" in carrying
    conf = _quota(1, lease_ttl=SHORT_LEASE) if with_quota else QueueConfig(workers=1, lease_ttl=SHORT_LEASE)
    gate = make_gate(late, {"q": conf})
    ran: list[str] = []
    gate.handle("q", lambda task: ran.append(task.id))
    async with gate:
        ids = await gate.submit_many("q", [None] * 6)
        with anyio.fail_after(GUARD):
            await anyio.to_thread.run_sync(late.claimed_meanwhile.wait)  # it gave up on the late call
        late.answer.set()
        done = [await eventually(gate, task_id, lambda t: t.status is Status.COMPLETED) for task_id in ids]
    assert late.late_leased and set(late.late_leased) <= set(ids)
    assert sorted(ran) == sorted(ids)  # each ran once: the late lease went back, not run twice
    for task in done:
        assert (task.lease_lost, task.attempts) == (0, 0)
        assert task.claims == 1 + late.put_back.get(task.id, 0)
    for task_id in late.late_leased:
        assert late.put_back.get(task_id, 0) >= 1
    if with_quota:
        assert await _units_left(broker) == LIMIT - len(ids)  # one unit per handler started
    assert await _free_slots(broker, 1) == 1


# -- shutdown, cancellation and the quota ----------------------------------------------------

# What a claim within the quota carries (on every backend).
QUOTA_CLAIM = frozenset({"quota", "shared"})


async def test_a_run_cancelled_during_a_claim_within_a_quota_gives_the_units_back(
    broker: Broker, backend: str
) -> None:
    late = Late(broker, QUOTA_CLAIM, acks_ride=False)
    gate = make_gate(late, {"q": _quota(2)})
    gate.handle("q", lambda task: "ran")
    ids = await gate.submit_many("q", [None, None])
    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        await anyio.to_thread.run_sync(late.held.wait, GUARD)
        tg.cancel_scope.cancel()  # while the claim is under way; it then answers
        late.answer.set()
    for task_id in ids:
        task = await gate.get(task_id)
        assert (task.status, task.claims, task.attempts, task.lease_lost) == (Status.PENDING, 1, 0, 0)
    assert await _units_left(broker) == LIMIT  # no handler started: every unit is back
    assert await _free_slots(broker, 2) == 2


async def test_after_the_shutdown_grace_a_task_that_never_started_gives_its_unit_back(
    broker: Broker, backend: str
) -> None:
    late = Late(broker, QUOTA_CLAIM, acks_ride=False)
    late.armed = False
    gate = make_gate(late, {"q": _quota(2)})
    started = anyio.Event()

    @gate.handler("q")
    async def forever(task: Task) -> None:
        started.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        first = await gate.submit("q")
        with anyio.fail_after(GUARD):
            await started.wait()
        late.armed = True
        second = await gate.submit("q")  # claimed by a call that answers only after the grace
        await anyio.to_thread.run_sync(late.held.wait, GUARD)
        tg.start_soon(gate.shutdown, 0)
        await anyio.wait_all_tasks_blocked()  # the grace is over: the started handler is stopped
        late.answer.set()
    assert late.late_leased == [second]
    for task_id in (first, second):
        task = await gate.get(task_id)
        assert (task.status, task.claims, task.attempts, task.lease_lost) == (Status.PENDING, 1, 0, 0)
    # The handler that started keeps its unit (it may have called the gateway); the task
    # claimed after the grace, whose handler never started, gives its unit back.
    assert await _units_left(broker) == LIMIT - 1
    assert await _free_slots(broker, 2) == 2
