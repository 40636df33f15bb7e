"""A broker called the way `Gate` calls one declaring ``inline_attempts``: first without waiting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taskgate.brokers import nowait
from taskgate.brokers.base import Broker

__all__ = ["AttemptedInline"]


class AttemptedInline:
    """Every public method is called under `nowait.no_wait` first and, when that answers
    `nowait.WouldBlock`, called again without the mark (as the runtime's thread would).

    ``inline`` and ``moved`` count the calls answered by the first attempt and the calls that
    had to be made again, so a test can tell that both paths ran.
    """

    def __init__(self, inner: Broker) -> None:
        self._inner = inner
        self.capabilities = inner.capabilities
        self.inline = 0
        self.moved = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute
        return self._attempted(attribute)

    def _attempted(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                with nowait.no_wait():
                    result = method(*args, **kwargs)
            except nowait.WouldBlock:
                self.moved += 1
                return method(*args, **kwargs)
            self.inline += 1
            return result

        return call
