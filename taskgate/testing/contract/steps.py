"""Contract: `Broker.step` -- a handler's durable step, read or stored once per (task, name).

A step's result is stored without a lease token (a run that lost its lease keeps what it paid
for), the first writer wins (racing runs agree on one result), and it belongs to one execution:
a replay starts without steps, and `Broker.prune` deletes a task's steps with it.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.brokers.params import MAX_STEP_BYTES, Prune, Step
from taskgate.clock import ManualClock
from taskgate.errors import TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import RACE_ROUNDS, TTL, claim_one, race_pair, submit

__all__ = ["StepContract"]

WEEK = timedelta(days=7)


class StepContract:
    """Durable steps (issue 39)."""

    def test_a_step_never_stored_reads_as_none(self, broker: Broker) -> None:
        task = submit(broker)
        assert broker.step(Step(task.id, "charge")) is None

    def test_a_stored_step_is_read_back_by_every_broker_of_the_store(
        self, broker: Broker, broker_factory: BrokerFactory
    ) -> None:
        task = submit(broker)
        claim_one(broker)
        result = '{"receipt":"r-1","note":"caf\u00e9"}'.encode()
        assert broker.step(Step(task.id, "charge", result)) == result
        other = broker_factory()
        assert other.step(Step(task.id, "charge")) == result
        assert other.step(Step(task.id, "ship")) is None

    def test_the_first_writer_wins(self, broker: Broker) -> None:
        task = submit(broker)
        assert broker.step(Step(task.id, "charge", b'"first"')) == b'"first"'
        assert broker.step(Step(task.id, "charge", b'"second"')) == b'"first"'
        assert broker.step(Step(task.id, "charge")) == b'"first"'

    def test_two_racing_writers_agree_on_one_result(self, broker_factory: BrokerFactory) -> None:
        one, two = broker_factory(), broker_factory()
        for _ in range(RACE_ROUNDS):
            task_id = submit(one).id
            a, b = race_pair(
                partial(one.step, Step(task_id, "charge", b'"a"')),
                partial(two.step, Step(task_id, "charge", b'"b"')),
            )
            assert a.ok and b.ok, (a.error, b.error)
            assert a.value == b.value and a.value in (b'"a"', b'"b"')
            assert one.step(Step(task_id, "charge")) == a.value

    def test_steps_are_kept_apart_by_task_and_by_name(self, broker: Broker) -> None:
        first, second = submit(broker), submit(broker)
        broker.step(Step(first.id, "charge", b"1"))
        broker.step(Step(first.id, "ship", b"2"))
        assert broker.step(Step(second.id, "charge")) is None
        assert broker.step(Step(first.id, "charge")) == b"1"
        assert broker.step(Step(first.id, "ship")) == b"2"
        assert broker.step(Step(first.id, "charge ")) is None  # names compare exactly

    def test_a_step_of_an_unknown_task_raises_and_stores_nothing(self, broker: Broker) -> None:
        missing = new_id()
        with pytest.raises(TaskNotFoundError):
            broker.step(Step(missing, "charge", b"1"))
        with pytest.raises(TaskNotFoundError):
            broker.step(Step(missing, "charge"))

    def test_a_run_that_lost_its_lease_still_stores_what_it_got(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        task = submit(broker)
        claim_one(broker)
        clock.advance(TTL)
        (reaped,) = broker.reap(lease_lost_max=5)
        assert reaped.status is Status.PENDING
        assert broker.step(Step(task.id, "charge", b'"paid"')) == b'"paid"'
        claim_one(broker)  # the next run finds it
        assert broker.step(Step(task.id, "charge")) == b'"paid"'

    def test_a_bad_name_or_an_oversized_result_is_refused_and_nothing_is_stored(self, broker: Broker) -> None:
        task = submit(broker)
        with pytest.raises(ValueError, match="step name must not be empty"):
            Step(task.id, "", b"1")
        with pytest.raises(TypeError, match="step name must be a str"):
            Step(task.id, 3, b"1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="step name must not contain NUL"):
            Step(task.id, "a\x00b", b"1")
        with pytest.raises(ValueError, match=f"result of step 'big' is {MAX_STEP_BYTES + 1} bytes"):
            Step(task.id, "big", b"x" * (MAX_STEP_BYTES + 1))
        with pytest.raises(TypeError, match="result of step 'text' must be bytes"):
            Step(task.id, "text", "1")  # type: ignore[arg-type]
        assert broker.step(Step(task.id, "big")) is None
        assert broker.step(Step(task.id, "text")) is None

    def test_the_largest_result_is_stored_whole(self, broker: Broker) -> None:
        task = submit(broker)
        largest = b'"' + b"x" * (MAX_STEP_BYTES - 2) + b'"'
        assert broker.step(Step(task.id, "big", largest)) == largest
        assert broker.step(Step(task.id, "big")) == largest

    def test_a_replay_starts_without_the_steps_of_the_execution_it_replays(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        broker.step(Step(task.id, "charge", b"1"))
        steps.fail(broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="boom")
        again = steps.replay(broker, task.id, new_id=new_id())
        assert broker.step(Step(again.id, "charge")) is None
        assert broker.step(Step(task.id, "charge")) == b"1"

    def test_prune_deletes_a_tasks_steps_with_it_and_keeps_the_others(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        old = submit(broker)
        lease = claim_one(broker)
        broker.step(Step(old.id, "charge", b'"old"'))
        steps.ack(broker, old.id, lease.token, b"done")
        clock.advance(WEEK)
        kept = submit(broker)
        broker.step(Step(kept.id, "charge", b'"kept"'))

        assert broker.prune(Prune((Status.COMPLETED,), older_than=WEEK)) == 1

        with pytest.raises(TaskNotFoundError):
            broker.step(Step(old.id, "charge"))
        assert broker.step(Step(kept.id, "charge")) == b'"kept"'
        # A task stored again under the pruned one's id finds none of its steps.
        again = submit(broker, id=old.id)
        assert broker.step(Step(again.id, "charge")) is None
