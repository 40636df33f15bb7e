"""One process of the two-process tracing test (``test_gate_tracing.py``), run as a script.

``producer URL PREFIX OUT``: inside a span of its own ("handle request"), submits one task of
type ``summarize`` and prints its id. ``worker URL PREFIX OUT TASK_ID``: runs a gate with the
``summarize`` handler (which opens a span of its own, "call model") until that task is done.
Each installs an OpenTelemetry SDK tracer provider as the global one, exporting to memory,
and writes the spans it ended to OUT as JSON, one object per span.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from taskgate import Config, Gate, QueueConfig, Task
from taskgate.brokers import open_broker

GUARD = 30.0


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": context.trace_id if context else None,
        "span_id": context.span_id if context else None,
        "parent_span_id": parent.span_id if parent else None,
        "parent_trace_id": parent.trace_id if parent else None,
        "attributes": dict(span.attributes or {}),
    }


def make_gate(url: str, prefix: str) -> Gate:
    options = {"key_prefix": prefix} if url.startswith("redis") else {}
    broker = open_broker(url, **options)
    return Gate(Config(broker=broker, queues={"summarize": QueueConfig(workers=1)}), poll_interval=0.02)


async def produce(gate: Gate) -> None:
    with trace.get_tracer("app").start_as_current_span("handle request"):
        task_id = await gate.submit("summarize", {"text": "hello"})
    print(task_id, flush=True)


async def work(gate: Gate, task_id: str) -> None:
    @gate.handler("summarize")
    async def summarize(task: Task) -> str:
        with trace.get_tracer("app").start_as_current_span("call model"):
            return "hi"

    async with gate:
        await gate.wait(task_id, timeout=GUARD)


def main(role: str, url: str, prefix: str, out: str, *rest: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    gate = make_gate(url, prefix)
    try:
        anyio.run(produce, gate) if role == "producer" else anyio.run(work, gate, rest[0])
    finally:
        gate.config.broker.close()
    with open(out, "w") as file:
        json.dump([span_record(span) for span in exporter.get_finished_spans()], file)


if __name__ == "__main__":
    main(*sys.argv[1:])
