"""A producer process: submits its share of the seeded plan, cancels and replays some tasks.

Usage: ``python -m torture.producer SPEC_JSON``. Every submit carries a business key (the
plan's name for it), so a submit whose answer a fault swallowed is retried without doubling
the task: the retry's `TaskExistsError` names the execution the first attempt made. Each
acknowledged submit, cancel and replay goes to the ledger with the task id.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from taskgate import (
    AlreadyFinalError,
    AlreadyReplayedError,
    Filter,
    Gate,
    ReplayNotFinalError,
    Status,
    TaskExistsError,
    TaskgateError,
)
from taskgate.brokers import open_broker

from .ledger import Ledger
from .workload import Item, config, plan

T = TypeVar("T")
GIVE_UP = 120.0  # seconds of failing calls before the producer reports the store gone for good
CANCEL_RATE, REPLAY_RATE = 0.04, 0.05
# Errors that are answers, not faults: retrying would not change them.
ANSWERS = (TaskExistsError, AlreadyFinalError, AlreadyReplayedError, ReplayNotFinalError)


async def _retry(call: Callable[[], Awaitable[T]], ledger: Ledger, what: str) -> T:
    deadline = time.monotonic() + GIVE_UP
    while True:
        try:
            return await call()
        except ANSWERS:
            raise
        except (TaskgateError, OSError) as exc:
            ledger.record("fault_seen", what=what, error=f"{type(exc).__name__}: {exc}"[:300])
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.2)


class Producer:
    """Submits ``items`` paced over ``duration`` seconds through ``gate``."""

    def __init__(self, gate: Gate, ledger: Ledger, rng: random.Random) -> None:
        self.gate, self.ledger, self.rng = gate, ledger, rng
        self.ids: dict[int, str] = {}
        self.replayed: set[str] = set()

    async def submit(self, item: Item) -> None:
        key = item.payload["k"]
        parents = [self.ids[p] for p in item.parents]

        async def call() -> str:
            return await self.gate.submit(
                item.type,
                item.payload,
                business_key=key,
                max_retry=item.max_retry,
                delay=item.delay or None,
                depends_on=parents,
                group=item.group,
            )

        by_key = False
        try:
            task_id = await _retry(call, self.ledger, "submit")
        except TaskExistsError as exc:  # an earlier attempt's answer was lost, its task was not
            task_id, by_key = exc.execution_id, True
        self.ids[item.ref] = task_id
        self.ledger.record(
            "submit", id=task_id, key=key, q=item.type, g=item.group, parents=parents, by_key=by_key
        )

    async def cancel_one(self) -> None:
        task_id = self.rng.choice(list(self.ids.values()))
        try:
            await _retry(lambda: self.gate.cancel(task_id), self.ledger, "cancel")
            outcome = "ok"
        except AlreadyFinalError:
            outcome = "final"
        self.ledger.record("cancel", id=task_id, out=outcome)

    async def replay_one(self) -> None:
        task_id = self.rng.choice(list(self.ids.values()))
        if task_id in self.replayed:
            return
        task = await _retry(lambda: self.gate.get(task_id), self.ledger, "get")
        if task.status not in (Status.FAILED, Status.CANCELED):
            return
        payload = {**task.json(), "fail": 0, "throttle": 0}
        self.replayed.add(task_id)
        try:
            new_id = await _retry(lambda: self.gate.replay(task_id, payload=payload), self.ledger, "replay")
        except AlreadyReplayedError:  # an earlier attempt made it: find it by its key
            executions = await _retry(
                lambda: self.gate.list(Filter(business_key=task.business_key)), self.ledger, "list"
            )
            new_id = next(t.id for t in executions if t.replay_of == task_id)
        except ReplayNotFinalError:
            return
        self.ledger.record("replay", id=new_id, of=task_id, q=task.queue, g=task.group)

    async def run(self, items: list[Item], duration: float) -> None:
        start = time.monotonic()
        for n, item in enumerate(items):
            pause = start + duration * n / len(items) - time.monotonic()
            if pause > 0:
                await anyio.sleep(pause)
            await self.submit(item)
            if self.rng.random() < CANCEL_RATE:
                await self.cancel_one()
            if self.rng.random() < REPLAY_RATE:
                await self.replay_one()


async def _produce(spec: dict[str, Any]) -> None:
    ledger = Ledger(spec["ledger"], spec["name"])
    broker = open_broker(spec["url"], **spec.get("options", {}))
    try:
        gate = Gate(config(broker))
        items = plan(spec["seed"], spec["index"], spec["count"], spec["long_rate"], spec["long_hold"])
        producer = Producer(gate, ledger, random.Random(f"{spec['seed']}/ops/{spec['index']}"))
        ledger.record("boot", planned=len(items))
        await producer.run(items, spec["duration"])
        ledger.record("done", submitted=len(producer.ids))
    finally:
        broker.close()


def main(argv: list[str]) -> None:
    """Produce the plan described by ``argv[0]`` (JSON)."""
    anyio.run(_produce, json.loads(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
