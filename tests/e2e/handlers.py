"""Handlers the scenarios register: real HTTP calls to the mock gateway, as an app would make them.

Both styles a user writes are here: plain ``def`` handlers (taskgate runs them in a worker
thread) and ``async def`` handlers that do the blocking call through ``anyio.to_thread``. Each
request carries the task id as its tag -- the idempotency key a real gateway would get -- so
a test can count the gateway's requests per task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from taskgate import Gate, Task

from .client import complete, stream

__all__ = [
    "PIPELINE_ROUTES",
    "complete_handler",
    "expected_score",
    "install_pipeline",
    "question",
    "stream_handler",
    "submit_chain",
]


def complete_handler(url: str) -> Callable[[Task], str]:
    """A sync handler: POST the payload's prompt to ``/v1/complete`` and return the output."""

    def handle(task: Task) -> str:
        return complete(url, task.id, task.json()["prompt"])

    return handle


def stream_handler(url: str) -> Callable[[Task], Awaitable[str]]:
    """An async handler: stream the payload's prompt from ``/v1/stream`` in a worker thread."""

    async def handle(task: Task) -> str:
        prompt = task.json()["prompt"]
        return await anyio.to_thread.run_sync(stream, url, task.id, prompt, abandon_on_cancel=True)

    return handle


# retrieve -> generate -> score, each stage on its own queue.
PIPELINE_ROUTES = {"retrieve": "ocr", "generate": "llm", "score": "cpu"}


def question(chain: int) -> str:
    """The question chain number ``chain`` starts from."""
    return f"question {chain} about quotas"


def expected_score(chain: int) -> dict[str, Any]:
    """What the score stage of chain ``chain`` must return, derived from its own question."""
    answer = f"ANSWER {question(chain).upper()}"
    return {"chain": chain, "answer": answer, "score": len(answer)}


def install_pipeline(gate: Gate, url: str) -> None:
    """Register the three stages; each reads its parent's result through ``gate.get``."""

    def retrieve(task: Task) -> dict[str, Any]:
        chain = task.json()["chain"]
        return {"chain": chain, "doc": complete(url, task.id, question(chain))}

    async def parent_result(task: Task) -> dict[str, Any]:
        parent = await gate.get(task.depends_on[0])
        result: dict[str, Any] = parent.result_json()
        return result

    async def generate(task: Task) -> dict[str, Any]:
        doc = await parent_result(task)
        prompt = f"answer {doc['doc']}"
        answer = await anyio.to_thread.run_sync(stream, url, task.id, prompt, abandon_on_cancel=True)
        return {"chain": doc["chain"], "answer": answer}

    async def score(task: Task) -> dict[str, Any]:
        generated = await parent_result(task)
        answer = generated["answer"]
        return {"chain": generated["chain"], "answer": answer, "score": len(answer)}

    gate.handle("retrieve", retrieve)
    gate.handle("generate", generate)
    gate.handle("score", score)


async def submit_chain(gate: Gate, chain: int) -> tuple[str, str, str]:
    """Submit one retrieve -> generate -> score chain; returns the three execution ids."""
    head = await gate.submit("retrieve", {"chain": chain})
    middle = await gate.submit("generate", None, depends_on=[head])
    tail = await gate.submit("score", None, depends_on=[middle])
    return head, middle, tail
