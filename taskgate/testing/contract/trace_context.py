"""Contract: a task's ``trace_context`` (the submitter's tracing context) is stored as given and
read back by every snapshot -- the submit's, a claim's, a read's -- alone or in a batch whose
tasks share it; a replay starts without one."""

from __future__ import annotations

from taskgate.brokers.base import Broker
from taskgate.brokers.params import Replay
from taskgate.ids import new_id
from taskgate.task import Filter
from taskgate.testing import steps
from taskgate.testing.contract._support import claim_one, new_task, submit

__all__ = ["TraceContextContract"]

CONTEXT = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"k=v"}'


class TraceContextContract:
    """Trace context stored with a task (issue 36)."""

    def test_a_trace_context_is_given_back_by_every_snapshot(self, broker: Broker) -> None:
        task = submit(broker, trace_context=CONTEXT)
        assert task.trace_context == CONTEXT
        assert claim_one(broker).task.trace_context == CONTEXT
        assert broker.get(task.id).trace_context == CONTEXT
        assert broker.list(Filter())[0].trace_context == CONTEXT

    def test_a_batch_sharing_a_trace_context_stores_it_on_each_task(self, broker: Broker) -> None:
        items = [new_task(payload=b"%d" % n, trace_context=CONTEXT) for n in range(3)]
        steps.enqueue(broker, items)
        assert [broker.get(item.id).trace_context for item in items] == [CONTEXT] * 3

    def test_a_task_without_one_reads_none_and_a_replay_starts_without_one(self, broker: Broker) -> None:
        plain = submit(broker)
        assert broker.get(plain.id).trace_context is None
        traced = submit(broker, queue="r", trace_context=CONTEXT)
        lease = claim_one(broker, queue="r")
        steps.ack(broker, traced.id, lease.token)
        replayed = broker.replay(Replay(traced.id, new_id(), allow_completed=True))
        assert replayed.trace_context is None and broker.get(replayed.id).trace_context is None
