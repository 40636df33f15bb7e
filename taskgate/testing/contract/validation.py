"""Contract: bad input raises a clear error and changes nothing.

The verbs' parameter objects (`taskgate.brokers.params`) check themselves on construction,
so a bad field raises a `TypeError`/`ValueError` naming it before any broker sees the call;
`BAD_CALLS` makes each such call on a broker holding a lease and a pending task, and holds
the store to what it was. The checks only a broker can make (ids in use, business keys,
lookups) follow.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from taskgate.brokers.base import MAX_DELAY, Broker, FailureKind, Lease, NewTask, QuotaGrant, QuotaSpec
from taskgate.brokers.params import (
    Canceled,
    Claim,
    Complete,
    Fail,
    GiveBack,
    Heartbeat,
    QueueQuery,
    Replay,
    Requeue,
    Retry,
    Settle,
    SharedLimits,
    Submit,
)
from taskgate.task import Filter
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import START
from taskgate.testing.contract._support import TTL, claim_one, new_task, stored_state, submit

__all__ = ["BAD_CALLS", "ValidationContract"]

BUSINESS = FailureKind.BUSINESS
MINUTE = timedelta(minutes=1)
GRANT = QuotaGrant("api", START, START + MINUTE, granted=2, limit=5)


def _any(value: object) -> Any:
    """``value`` typed as anything: these calls pass what the signatures forbid on purpose."""
    return value


# One bad call per entry: (broker, a held lease) -> the call; the error; a pattern of its message.
BadCall = Callable[[Broker, Lease], object]
BAD_CALLS: dict[str, tuple[BadCall, type[Exception], str]] = {
    # submit
    "Submit.tasks one NewTask": (lambda b, _: b.submit(Submit(_any(new_task()))), TypeError, "Submit.tasks"),
    "Submit.tasks a str": (lambda b, _: b.submit(Submit(_any("tasks"))), TypeError, "Submit.tasks"),
    "Submit.tasks[1]": (
        lambda b, _: b.submit(Submit(_any((new_task(), "x")))),
        TypeError,
        r"Submit.tasks\[1\]",
    ),
    "NewTask.id": (lambda b, _: b.submit(Submit((NewTask("", "t", "q"),))), ValueError, "task id"),
    "NewTask.type": (lambda b, _: b.submit(Submit((new_task(type=_any(5)),))), TypeError, "task type"),
    "NewTask.queue": (lambda b, _: b.submit(Submit((new_task(queue="x" * 256),))), ValueError, "queue"),
    "NewTask.payload": (
        lambda b, _: b.submit(Submit((new_task(payload=_any("text")),))),
        TypeError,
        "payload",
    ),
    "NewTask.max_retry": (lambda b, _: b.submit(Submit((new_task(max_retry=-1),))), ValueError, "max_retry"),
    "NewTask.run_at": (
        lambda b, _: b.submit(Submit((new_task(run_at=datetime(2030, 1, 1)),))),  # naive: no timezone
        ValueError,
        "run_at",
    ),
    "NewTask.delay": (
        lambda b, _: b.submit(Submit((new_task(delay=timedelta(seconds=-1)),))),
        ValueError,
        "delay",
    ),
    "NewTask.depends_on": (
        lambda b, lease: b.submit(Submit((new_task(depends_on=_any(lease.task.id)),))),
        TypeError,
        "depends_on",
    ),
    "NewTask.business_key": (
        lambda b, _: b.submit(Submit((new_task(business_key="k\x00"),))),
        ValueError,
        "business_key",
    ),
    "NewTask.group empty": (
        lambda b, _: b.submit(Submit((new_task(group=""),))),
        ValueError,
        "group",
    ),
    "NewTask.group too long": (
        lambda b, _: b.submit(Submit((new_task(group="g" * 256),))),
        ValueError,
        "group",
    ),
    "NewTask.group not a str": (
        lambda b, _: b.submit(Submit((new_task(group=_any(42)),))),
        TypeError,
        "group",
    ),
    "NewTask.timeout zero": (
        lambda b, _: b.submit(Submit((new_task(timeout=timedelta(0)),))),
        ValueError,
        "timeout",
    ),
    "NewTask.timeout negative": (
        lambda b, _: b.submit(Submit((new_task(timeout=-MINUTE),))),
        ValueError,
        "timeout",
    ),
    "NewTask.timeout beyond the maximum": (
        lambda b, _: b.submit(Submit((new_task(timeout=MAX_DELAY + timedelta(milliseconds=1)),))),
        ValueError,
        "timeout",
    ),
    "NewTask.timeout seconds": (
        lambda b, _: b.submit(Submit((new_task(timeout=_any(30)),))),
        TypeError,
        "timeout",
    ),
    # replay
    "Replay.execution_id": (lambda b, _: b.replay(Replay("", "new")), ValueError, "execution id"),
    "Replay.new_id": (lambda b, lease: b.replay(Replay(lease.task.id, "")), ValueError, "new id"),
    "Replay.payload": (
        lambda b, lease: b.replay(Replay(lease.task.id, "new", payload=_any("text"))),
        TypeError,
        "payload",
    ),
    "Replay.descendants (not pairs)": (
        lambda b, lease: b.replay(Replay(lease.task.id, "new", descendants=_any(("a", "b", "c")))),
        TypeError,
        "Replay.descendants",
    ),
    "Replay.descendants (a pair of three)": (
        lambda b, lease: b.replay(Replay(lease.task.id, "new", descendants=_any((("a", "b", "c"),)))),
        ValueError,
        "pair",
    ),
    "Replay.descendants (an id twice)": (
        lambda b, lease: b.replay(Replay(lease.task.id, "new", descendants=(("a", "new"),))),
        ValueError,
        "repeats an id",
    ),
    "Replay.descendants (a bad id)": (
        lambda b, lease: b.replay(Replay(lease.task.id, "new", descendants=(("a", ""),))),
        ValueError,
        "new id",
    ),
    # queue state
    "QueueQuery.queue": (lambda b, _: b.queue_state(QueueQuery("")), ValueError, "QueueQuery.queue"),
    "QueueQuery.queue a number": (
        lambda b, _: b.queue_state(QueueQuery(_any(7))),
        TypeError,
        "QueueQuery.queue",
    ),
    "QueueQuery.quota": (
        lambda b, _: b.queue_state(QueueQuery("q", quota=_any("api"))),
        TypeError,
        "QueueQuery.quota",
    ),
    "QueueQuery.quota limit": (
        lambda b, _: b.queue_state(QueueQuery("q", quota=QuotaSpec("api", 0, MINUTE))),
        ValueError,
        "quota limit",
    ),
    # claim
    "Claim.queue": (lambda b, _: b.claim(Claim("", 1, TTL)), ValueError, "queue"),
    "Claim.limit": (lambda b, _: b.claim(Claim("q", 0, TTL)), ValueError, "claim limit"),
    "Claim.limit a bool": (lambda b, _: b.claim(Claim("q", _any(True), TTL)), TypeError, "claim limit"),
    "Claim.lease_ttl": (lambda b, _: b.claim(Claim("q", 1, timedelta(0))), ValueError, "lease_ttl"),
    "Claim.lease_ttl seconds": (lambda b, _: b.claim(Claim("q", 1, _any(30))), TypeError, "lease_ttl"),
    "Claim.quota": (lambda b, _: b.claim(Claim("q", 1, TTL, quota=_any("api"))), TypeError, "Claim.quota"),
    "Claim.shared": (lambda b, _: b.claim(Claim("q", 1, TTL, shared=_any(3))), TypeError, "Claim.shared"),
    "Claim.acks": (
        lambda b, lease: b.claim(Claim("q", 1, TTL, acks=_any(((lease.task.id, lease.token, None),)))),
        TypeError,
        "Claim.acks",
    ),
    "QuotaSpec.key": (
        lambda b, _: b.claim(Claim("q", 1, TTL, quota=QuotaSpec("", 1, MINUTE))),
        ValueError,
        "quota key",
    ),
    "QuotaSpec.limit": (
        lambda b, _: b.claim(Claim("q", 1, TTL, quota=QuotaSpec("api", 0, MINUTE))),
        ValueError,
        "quota limit",
    ),
    "QuotaSpec.period": (
        lambda b, _: b.claim(Claim("q", 1, TTL, quota=QuotaSpec("api", 1, timedelta(0)))),
        ValueError,
        "quota period",
    ),
    "SharedLimits.workers": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(0))),
        ValueError,
        "SharedLimits.workers",
    ),
    "SharedLimits.rps": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, rps=-1.0))),
        ValueError,
        "SharedLimits.rps",
    ),
    "SharedLimits.burst": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, burst=-1))),
        ValueError,
        "SharedLimits.burst",
    ),
    "SharedLimits.release": (
        lambda b, lease: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, release=_any(lease.token)))),
        TypeError,
        "SharedLimits.release",
    ),
    "SharedLimits.claimer": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, claimer=_any(None)))),
        TypeError,
        "SharedLimits.claimer",
    ),
    "SharedLimits.group_workers": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, group_workers=-1))),
        ValueError,
        "SharedLimits.group_workers",
    ),
    "SharedLimits.group_rps": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, group_rps=float("nan")))),
        ValueError,
        "SharedLimits.group_rps",
    ),
    "SharedLimits.group_quota_limit without a period": (
        lambda b, _: b.claim(Claim("q", 1, TTL, shared=SharedLimits(1, group_quota_limit=3))),
        ValueError,
        "group_quota_period",
    ),
    # settle
    "Settle.items one item": (
        lambda b, lease: b.settle(Settle(_any(Complete(lease.task.id, lease.token)))),
        TypeError,
        "Settle.items",
    ),
    "Settle.items[1]": (
        lambda b, lease: b.settle(Settle(_any((Complete(lease.task.id, lease.token), "done")))),
        TypeError,
        r"Settle.items\[1\]",
    ),
    "Settle.give_back": (lambda b, _: b.settle(Settle(give_back=_any(2))), TypeError, "Settle.give_back"),
    "Complete.task_id": (
        lambda b, lease: b.settle(Settle((Complete("", lease.token),))),
        ValueError,
        "task id",
    ),
    "Complete.token": (
        lambda b, lease: b.settle(Settle((Complete(lease.task.id, _any(5)),))),
        TypeError,
        "lease token",
    ),
    "Complete.result": (
        lambda b, lease: b.settle(Settle((Complete(lease.task.id, lease.token, _any("text")),))),
        TypeError,
        "result",
    ),
    "Retry.kind": (
        lambda b, lease: b.settle(Settle((Retry(lease.task.id, lease.token, _any("business"), "x"),))),
        TypeError,
        "Retry.kind",
    ),
    "Retry.error": (
        lambda b, lease: b.settle(Settle((Retry(lease.task.id, lease.token, BUSINESS, _any(None)),))),
        TypeError,
        "Retry.error",
    ),
    "Retry.delay negative": (
        lambda b, lease: b.settle(Settle((Retry(lease.task.id, lease.token, BUSINESS, "x", -MINUTE),))),
        ValueError,
        "Retry.delay",
    ),
    "Retry.delay beyond the maximum": (
        lambda b, lease: b.settle(
            Settle((Retry(lease.task.id, lease.token, BUSINESS, "x", MAX_DELAY + timedelta(days=1)),))
        ),
        ValueError,
        "Retry.delay",
    ),
    "Retry.delay of 1e12 seconds": (
        lambda b, lease: b.settle(
            Settle((Retry(lease.task.id, lease.token, BUSINESS, "x", timedelta(seconds=1e12)),))
        ),
        ValueError,
        "Retry.delay",
    ),
    "Fail.kind": (
        lambda b, lease: b.settle(Settle((Fail(lease.task.id, lease.token, _any(None), "x"),))),
        TypeError,
        "Fail.kind",
    ),
    "Requeue.task_id": (
        lambda b, lease: b.settle(Settle((Requeue("x" * 256, lease.token),))),
        ValueError,
        "task id",
    ),
    "Canceled.token": (
        lambda b, lease: b.settle(Settle((Canceled(lease.task.id, _any(None)),))),
        TypeError,
        "lease token",
    ),
    "GiveBack.quota units": (
        lambda b, lease: b.settle(Settle(give_back=GiveBack(quota=((GRANT, -1),)))),
        ValueError,
        "GiveBack.quota units",
    ),
    "GiveBack.quota beyond the grant": (
        lambda b, lease: b.settle(Settle(give_back=GiveBack(quota=((GRANT, 3),)))),
        ValueError,
        "give back 3 units",
    ),
    "GiveBack.quota pairs": (
        lambda b, lease: b.settle(Settle(give_back=GiveBack(quota=_any((("api", 1),))))),
        TypeError,
        "GiveBack.quota",
    ),
    "GiveBack.slots without a queue": (
        lambda b, lease: b.settle(Settle(give_back=GiveBack(slots=(lease.token,)))),
        ValueError,
        "GiveBack.slots",
    ),
    "GiveBack.slots a str": (
        lambda b, lease: b.settle(Settle(give_back=GiveBack(queue="q", slots=_any(lease.token)))),
        TypeError,
        "GiveBack.slots",
    ),
    "GiveBack.queue": (
        lambda b, _: b.settle(Settle(give_back=GiveBack(queue=""))),
        ValueError,
        "GiveBack.queue",
    ),
    # heartbeat
    "Heartbeat.token": (
        lambda b, lease: b.heartbeat(Heartbeat(lease.task.id, _any(1), TTL)),
        TypeError,
        "lease token",
    ),
    "Heartbeat.lease_ttl": (
        lambda b, lease: b.heartbeat(Heartbeat(lease.task.id, lease.token, timedelta(0))),
        ValueError,
        "lease_ttl",
    ),
    "Heartbeat.slot_queue": (
        lambda b, lease: b.heartbeat(Heartbeat(lease.task.id, lease.token, TTL, slot_queue="")),
        ValueError,
        "slot.queue",
    ),
}


class ValidationContract:
    """Malformed parameters, ids and out-of-range numbers are refused before anything changes."""

    @pytest.mark.parametrize("name", sorted(BAD_CALLS))
    def test_a_call_with_a_bad_parameter_names_it_and_changes_nothing(
        self, broker: Broker, name: str
    ) -> None:
        call, error, field = BAD_CALLS[name]
        submit(broker)
        lease = claim_one(broker)
        submit(broker)
        before = stored_state(broker)
        with pytest.raises(error, match=field):
            call(broker, lease)
        assert stored_state(broker) == before
        assert steps.heartbeat(broker, lease.task.id, lease.token, TTL).cancel_requested is False

    @pytest.mark.parametrize("bad_id", ["", "x" * 256, "nul\x00byte"])
    def test_get_of_a_malformed_id_raises_value_error(self, broker: Broker, bad_id: str) -> None:
        with pytest.raises(ValueError):
            broker.get(bad_id)

    def test_a_list_by_an_oversized_business_key_raises_value_error(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            steps.history(broker, "k" * 256)

    def test_reap_with_a_limit_below_one_raises_value_error(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            broker.reap(lease_lost_max=3, limit=0)

    def test_a_submit_of_a_business_key_twice_raises_and_stores_nothing(self, broker: Broker) -> None:
        with pytest.raises(ValueError):
            steps.enqueue(broker, [new_task(business_key="same"), new_task(business_key="same")])
        assert broker.list(Filter()) == []

    def test_a_submit_of_one_id_twice_raises_and_stores_nothing(self, broker: Broker) -> None:
        twice = new_task()
        with pytest.raises(ValueError):
            broker.submit(Submit((twice, NewTask(twice.id, "other", "q"))))
        assert broker.list(Filter()) == []
