"""What the split-call tests of every broker share (`taskgate.brokers.split`): a broker that
counts its split calls, the runtime's wait for a reply done with ``select``, and an
``on_abandoned`` that keeps what a late call answered."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable
from typing import Any

from taskgate.brokers.base import Lease
from taskgate.brokers.params import Claimed
from taskgate.brokers.split import SplitCall

GUARD = 15.0  # as gate_helpers.GUARD: anything that should take milliseconds


class CountsSplits:
    """Mixed into a broker class: counts the calls it split and those it left to a thread."""

    split_names: list[str]
    unsplit: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.split_names = []
        self.unsplit = 0

    def split(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> SplitCall[Any] | None:
        call: SplitCall[Any] | None = super().split(method, *args, **kwargs)
        if call is None:
            self.unsplit += 1
        else:
            name = getattr(method, "__name__", None) or getattr(getattr(method, "func", None), "__name__", "")
            self.split_names.append(name)
        return call


def drive(call: SplitCall[Any]) -> Any:
    """What the runtime does on the event loop, with select: wait readable, receive, answer."""
    while True:
        readable, _, _ = select.select([call.fileno()], [], [], GUARD)
        assert readable, "no reply within the guard"
        if call.receive():
            return call.result()


class LateLeases:
    """An ``on_abandoned`` that keeps the leases a late claim answered, for the test to wait on
    (the claim's `Claimed`, or its leases alone)."""

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self._got = threading.Event()

    def __call__(self, answer: Claimed | list[Lease]) -> None:
        self.leases = answer.leases if isinstance(answer, Claimed) else answer
        self._got.set()

    def wait(self) -> list[Lease]:
        assert self._got.wait(GUARD), "the abandoned call never answered"
        return self.leases
