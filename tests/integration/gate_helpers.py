"""Helpers of the runtime tests (tests/integration/test_gate_*.py); fixtures are in conftest.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio

from taskgate import Config, Gate, QueueConfig, Task
from taskgate.brokers.base import Broker, Capabilities, NewTask, QuotaSpec
from taskgate.brokers.params import Claim, Complete, Finish, Heartbeat, Settle, SharedLimits, Submit
from taskgate.ids import new_id

POLL = 0.02  # poll interval of test gates: fast, yet no test relies on it for same-process work
GUARD = 15.0  # generous fail_after guard for anything that should take milliseconds


def make_gate(broker: Broker, queues: dict[str, QueueConfig] | None = None, **options: Any) -> Gate:
    """A gate over ``broker`` with fast polling; ``options`` go to `Config` (or `Gate` for intervals)."""
    gate_options = {k: options.pop(k) for k in ("poll_interval", "reap_interval") if k in options}
    gate_options.setdefault("poll_interval", POLL)
    config = Config(broker=broker, queues=queues or {"q": QueueConfig(workers=2)}, **options)
    return Gate(config, **gate_options)


def echo_gate(broker: Broker, workers: int, hook_into: list[Task] | None) -> Gate:
    """A gate whose queue "q" answers each task's id, hooked into ``hook_into`` unless None.

    Its poll is far beyond `GUARD`: only a wake-up of this process's own making can start a
    task it did not find on its first look."""
    hook = {"on_state_change": hook_into.append} if hook_into is not None else {}
    gate = make_gate(broker, {"q": QueueConfig(workers=workers)}, poll_interval=GUARD * 2, **hook)

    @gate.handler("q")
    async def echo(task: Task) -> str:
        return task.id

    return gate


async def eventually(gate: Gate, task_id: str, check: Callable[[Task], bool], within: float = GUARD) -> Task:
    """Re-read ``task_id`` until ``check`` holds (a condition wait with a generous guard)."""
    with anyio.fail_after(within):
        while True:
            task = await gate.get(task_id)
            if check(task):
                return task
            await anyio.sleep(0.005)


async def until(check: Callable[[], Awaitable[bool]], within: float = GUARD) -> None:
    """Wait until the async predicate ``check`` holds (a condition wait with a generous guard)."""
    with anyio.fail_after(within):
        while True:
            if await check():
                return
            await anyio.sleep(0.005)


def carried(claim: Claim) -> frozenset[str]:
    """What a claim carries besides itself: any of ``acks``, ``quota`` and ``shared``."""
    fields = {"acks": bool(claim.acks), "quota": claim.quota is not None, "shared": claim.shared is not None}
    return frozenset(name for name, present in fields.items() if present)


def is_ack_batch(settle: Settle) -> bool:
    """Whether ``settle`` only completes runs (what the ack writer sends), giving nothing back."""
    items = settle.items
    return bool(items) and settle.give_back is None and all(isinstance(item, Complete) for item in items)


def call_labels(verb: str, args: tuple[Any, ...]) -> list[str]:
    """The names a broker call counts under in `Faulty`: its verb and, for a verb taking a
    parameter object, each thing that object carries -- ``claim.acks``/``claim.quota``/
    ``claim.shared``, ``settle.<item kind>`` (``settle.complete``, ``settle.requeue``, ...) and
    ``settle.give_back``, ``heartbeat.slot``, ``submit.quiet`` (no snapshots asked)."""
    labels = [verb]
    param = args[0] if args else None
    if isinstance(param, Claim):
        labels += [f"claim.{name}" for name in sorted(carried(param))]
    elif isinstance(param, Settle):
        labels += sorted({f"settle.{type(item).__name__.lower()}" for item in param.items})
        if param.give_back is not None:
            labels.append("settle.give_back")
    elif isinstance(param, Heartbeat) and param.slot_queue is not None:
        labels.append("heartbeat.slot")
    elif isinstance(param, Submit) and not param.snapshots:
        labels.append("submit.quiet")
    return labels


class Faulty:
    """A broker wrapper that makes chosen calls raise `BrokerError` (or anything) on demand.

    ``failing`` and ``calls`` are keyed by `call_labels`: ``failing["claim.quota"]`` fails
    every claim carrying a quota, ``calls["settle.requeue"]`` counts the settles that put a
    lease back. ``settled`` lists every item settled through it, in order.
    """

    def __init__(self, inner: Broker, capabilities: Capabilities | None = None) -> None:
        self._inner = inner
        self.capabilities = capabilities or inner.capabilities
        self.failing: dict[str, BaseException] = {}
        self.calls: dict[str, int] = {}
        self.settled: list[Finish] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            labels = call_labels(name, args)
            for label in labels:
                self.calls[label] = self.calls.get(label, 0) + 1
            error = next((self.failing[label] for label in labels if label in self.failing), None)
            if error is not None:
                raise error
            if args and isinstance(args[0], Settle):
                self.settled.extend(args[0].items)
            return target(*args, **kwargs)

        return call

    def settled_as(self, kind: type) -> list[str]:
        """Ids of the tasks whose items of ``kind`` (`Requeue`, `Complete`, ...) went through."""
        return [item.task_id for item in self.settled if isinstance(item, kind)]


# -- what is left of shared capacity, read by taking it -------------------------------------

PROBE_LEASE = timedelta(minutes=5)


def _fresh(queue: str) -> NewTask:
    return NewTask(id=new_id(), type="probe", queue=queue)


def units_left(broker: Broker, key: str, limit: int, period: timedelta) -> int:
    """Units left in quota ``key``'s current window (``limit`` per ``period``), by claiming
    that many probe tasks within it: it takes them, so call it last."""
    broker.submit(Submit(tuple(_fresh("units-probe") for _ in range(limit)), snapshots=False))
    claimed = broker.claim(Claim("units-probe", limit, PROBE_LEASE, quota=QuotaSpec(key, limit, period)))
    return len(claimed.leases)


def free_slots(broker: Broker, queue: str, workers: int) -> int:
    """How many of ``queue``'s ``workers`` shared slots are free (a broker with
    ``shared_limits``), by claiming that many fresh tasks of it under the limit: it takes them."""
    broker.submit(Submit(tuple(_fresh(queue) for _ in range(workers)), snapshots=False))
    claimed = broker.claim(Claim(queue, workers, PROBE_LEASE, shared=SharedLimits(workers=workers)))
    return len(claimed.leases)
