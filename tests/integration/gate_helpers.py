"""Helpers of the runtime tests (tests/integration/test_gate_*.py); fixtures are in conftest.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from taskgate import Config, Gate, QueueConfig, Task
from taskgate.brokers.base import Broker, Capabilities

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


class Faulty:
    """A broker wrapper that makes chosen methods raise `BrokerError` (or anything) on demand."""

    def __init__(self, inner: Broker, capabilities: Capabilities | None = None) -> None:
        self._inner = inner
        self.capabilities = capabilities or inner.capabilities
        self.failing: dict[str, BaseException] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            error = self.failing.get(name)
            if error is not None:
                raise error
            return target(*args, **kwargs)

        return call
