"""Smoke test against a REAL OpenAI-compatible chat gateway; never part of CI.

It runs only when selected by its marker AND given a gateway by the person running it::

    LLM_GATEWAY_URL=https://gateway.example/v1/chat/completions LLM_GATEWAY_KEY=... \
    LLM_GATEWAY_MODEL=some-model .venv/bin/pytest tests/e2e -m real_gateway -v

Without ``-m real_gateway`` the test is skipped (see ``conftest.py``), and without the URL and
key it skips too. A 429/503 or a "busy"/"overloaded"/"rate limit" error behind a 200 raises
`taskgate.Throttled`, as an application's client should.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

import anyio
import pytest

import taskgate
from taskgate import Config, Gate, QueueConfig, Status, Task
from taskgate.brokers import MemoryBroker

pytestmark = [pytest.mark.anyio, pytest.mark.real_gateway]

BUSY_WORDS = ("busy", "overloaded", "rate limit", "rate_limit", "too many requests")


def gateway_from_env() -> tuple[str, str, str]:
    url, key = os.environ.get("LLM_GATEWAY_URL"), os.environ.get("LLM_GATEWAY_KEY")
    if not url or not key:
        pytest.skip("set LLM_GATEWAY_URL and LLM_GATEWAY_KEY to run the real-gateway smoke test")
    return url, key, os.environ.get("LLM_GATEWAY_MODEL", "gpt-4o-mini")


def _throttled_if_busy(text: str, retry_after: str | None = None) -> None:
    if any(word in text.lower() for word in BUSY_WORDS):
        raise taskgate.Throttled(retry_after=float(retry_after or 2), message=text[:200])


def chat(url: str, key: str, model: str, prompt: str) -> str:
    """One chat completion; Throttled on busy (whatever the status code says)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code in (429, 503):
            raise taskgate.Throttled(retry_after=float(exc.headers.get("Retry-After") or 2)) from exc
        raise
    answer: dict[str, Any] = json.loads(text)
    if "error" in answer:
        _throttled_if_busy(json.dumps(answer["error"]))
        raise RuntimeError(f"gateway error: {answer['error']}")
    return str(answer["choices"][0]["message"]["content"])


async def test_a_real_gateway_answers_through_the_queue() -> None:
    url, key, model = gateway_from_env()
    gate = Gate(
        Config(broker=MemoryBroker(), queues={"llm": QueueConfig(workers=2, rps=1)}, routes={"chat": "llm"})
    )

    async def handle(task: Task) -> str:
        return await anyio.to_thread.run_sync(chat, url, key, model, task.json()["prompt"])

    gate.handle("chat", handle)
    async with gate:
        ids = [await gate.submit("chat", {"prompt": f"Reply with the number {i}."}) for i in range(3)]
        results = [await gate.wait(task_id, timeout=120) for task_id in ids]
        tasks = [await gate.get(task_id) for task_id in ids]
    assert all(t.status is Status.COMPLETED and t.attempts == 0 for t in tasks)
    assert all(json.loads(r or b'""') for r in results)
