"""Contract: a heartbeat carrying ``progress`` stores it on the task (`Task.progress`).

The holder's token is checked as for any heartbeat: a stale one stores nothing. The value is
the JSON text given, read back unchanged by every snapshot; a replay starts without one.
"""

from __future__ import annotations

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import MAX_PROGRESS_BYTES, Heartbeat
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError
from taskgate.ids import new_id
from taskgate.task import Filter
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, submit

__all__ = ["ProgressContract"]


class ProgressContract:
    """Progress reports (issue 36)."""

    def test_a_heartbeat_with_progress_stores_it_for_every_read(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        assert lease.task.progress is None
        text = '{"done":3,"of":10,"note":"caf\\u00e9"}'
        broker.heartbeat(Heartbeat(task.id, lease.token, TTL, progress=text))

        stored = broker.get(task.id)
        assert stored.progress_json == text
        assert stored.progress == {"done": 3, "of": 10, "note": "café"}
        assert broker.list(Filter())[0].progress_json == text
        broker.heartbeat(Heartbeat(task.id, lease.token, TTL))  # a plain heartbeat keeps it
        assert steps.ack(broker, task.id, lease.token).progress_json == text

    def test_the_largest_progress_is_stored_and_a_larger_one_refused(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        largest = '"' + "x" * (MAX_PROGRESS_BYTES - 2) + '"'
        broker.heartbeat(Heartbeat(task.id, lease.token, TTL, progress=largest))
        assert broker.get(task.id).progress_json == largest
        with pytest.raises(ValueError, match="at most 65536"):
            Heartbeat(task.id, lease.token, TTL, progress=largest + " ")
        with pytest.raises(TypeError, match="progress"):
            Heartbeat(task.id, lease.token, TTL, progress=3)  # type: ignore[arg-type]

    def test_a_stale_token_stores_no_progress(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        old = claim_one(broker)
        clock.advance(TTL)
        broker.reap(lease_lost_max=5)
        claim_one(broker)
        with pytest.raises(LeaseLostError):
            broker.heartbeat(Heartbeat(task.id, old.token, TTL, progress="1"))
        assert broker.get(task.id).progress is None

    def test_a_replay_starts_without_progress(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        broker.heartbeat(Heartbeat(task.id, lease.token, TTL, progress="[1]"))
        steps.fail(broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="e")
        assert broker.get(task.id).progress == [1]
        assert steps.replay(broker, task.id, new_id=new_id()).progress is None
