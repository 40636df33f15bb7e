"""Tasks for the dashboard tests, stored through the broker's own verbs: a small pipeline
with a quota-bound stage, a failed task with a traceback, and a payload written to attack."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from taskgate import QueueConfig
from taskgate.brokers.base import Broker, FailureKind, NewTask, QuotaSpec
from taskgate.brokers.params import Claim, Complete, Fail, Settle, Submit

# The queues the dashboard is told about: "llm" has a quota of 100 starts an hour.
QUEUES = {
    "llm": QueueConfig(workers=2, rps=3, quota_limit=100, quota_period="1h"),
    "cpu": QueueConfig(workers=4),
}
LLM_QUOTA = QuotaSpec(key="llm", limit=100, period=timedelta(hours=1))
LEASE = timedelta(minutes=5)
# Markup in a payload, an error and a type name: a page must show it, never run it.
ATTACK = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 1">'


@dataclass(frozen=True)
class Seeded:
    """The ids of the seeded tasks."""

    retrieve: str = "01SEEDRETRIEVE"
    generate: str = "01SEEDGENERATE"
    score: str = "01SEEDSCORE"
    ocr: str = "01SEEDOCR"
    attack: str = "01SEEDATTACK"
    waiting: str = "01SEEDWAITING"


def seed(broker: Broker) -> Seeded:
    """Store the tasks every dashboard test looks at; see the module docstring."""
    ids = Seeded()
    broker.submit(
        Submit(
            (
                NewTask(ids.retrieve, "retrieve", "llm", payload=json.dumps({"q": "why"}).encode()),
                NewTask(ids.generate, "generate", "llm", depends_on=(ids.retrieve,)),
                NewTask(ids.score, "score", "cpu", depends_on=(ids.generate,)),
                NewTask(ids.ocr, "ocr", "cpu", payload=b"\x89PNG\r\n\x1a\n\x00\x01", business_key="scan-7"),
                NewTask(ids.attack, ATTACK, "cpu", payload=json.dumps({"name": ATTACK}).encode()),
                NewTask(ids.waiting, "ocr", "cpu", payload=b"plain text payload"),
            )
        )
    )
    _complete(broker, "llm", "retrieve", json.dumps({"docs": ["a", "b"]}).encode())
    _fail(
        broker, "ocr", "ValueError: unreadable scan", 'Traceback (most recent call last):\n  File "ocr.py"\n'
    )
    _fail(broker, ATTACK, f"RuntimeError: {ATTACK}", f"Traceback:\n  {ATTACK}\n")
    return ids


def _claimed(broker: Broker, task_type: str, queue: str) -> tuple[str, str]:
    quota = LLM_QUOTA if queue == "llm" else None
    lease = broker.claim(Claim(queue, 1, LEASE, quota=quota, types=(task_type,))).leases[0]
    return lease.task.id, lease.token


def _complete(broker: Broker, queue: str, task_type: str, result: bytes) -> None:
    task_id, token = _claimed(broker, task_type, queue)
    broker.settle(Settle((Complete(task_id, token, result),)))


def _fail(broker: Broker, task_type: str, error: str, traceback: str) -> None:
    task_id, token = _claimed(broker, task_type, "cpu")
    broker.settle(Settle((Fail(task_id, token, FailureKind.BUSINESS, error, traceback=traceback),)))


def busy(broker: Broker) -> None:
    """A store in mid-run, for the README's screenshot: a few dozen pipeline tasks in every
    status, quota units spent, one failure with its traceback."""
    tasks = []
    for n in range(12):
        tasks.append(
            NewTask(f"01DOCRETRIEVE{n:02}", "retrieve", "cpu", payload=json.dumps({"doc": n}).encode())
        )
        tasks.append(NewTask(f"01DOCGENERATE{n:02}", "generate", "llm", depends_on=(f"01DOCRETRIEVE{n:02}",)))
        tasks.append(NewTask(f"01DOCSCORE{n:02}", "score", "cpu", depends_on=(f"01DOCGENERATE{n:02}",)))
    broker.submit(Submit(tuple(tasks)))
    for _ in range(9):
        _complete(broker, "cpu", "retrieve", b'{"docs": 3}')
    for _ in range(5):
        _complete(broker, "llm", "generate", b'{"answer": "..."}')
    for _ in range(3):
        _complete(broker, "cpu", "score", b'{"score": 0.9}')
    _fail(broker, "score", "ValueError: score out of range", "Traceback (most recent call last):\n  ...\n")
    broker.claim(Claim("llm", 2, LEASE, quota=LLM_QUOTA, types=("generate",)))  # two running
