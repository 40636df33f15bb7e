"""Middleware: coroutines wrapped around every handler run (``Config(middleware=[...])``).

A middleware is ``async def mw(task, call_next)``: it may do something before and after
``await call_next()`` (which takes no arguments and returns the handler's value), change what
it returns, or raise instead of calling it. What a middleware raises is decided as if the
handler had raised it: `SkipRetry` fails the task, `Throttled` re-queues it, any other
exception counts a business failure -- so raising before ``call_next`` vetoes the run.
The first middleware of the list is the outermost.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from taskgate.errors import ConfigError
from taskgate.task import Task

__all__ = ["CallNext", "Middleware", "check_middleware", "run_through"]

CallNext = Callable[[], Awaitable[Any]]
"""What a middleware calls to go on: the next middleware, or the handler itself."""

Middleware = Callable[[Task, CallNext], Awaitable[Any]]
"""``async def mw(task, call_next)``: see the module docstring."""


def check_middleware(items: object, *, where: str = "Config.middleware") -> tuple[Middleware, ...]:
    """``items`` as a tuple, each a coroutine function (or an object whose ``__call__`` is one);
    else `ConfigError` naming the first that is not."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ConfigError(f"{where} must be a list of coroutine functions, got {items!r}")
    for index, item in enumerate(items):
        if not _is_coroutine_function(item):
            raise ConfigError(
                f"{where}[{index}] = {_name(item)} is not a coroutine function: "
                "write it as `async def mw(task, call_next)`"
            )
    return tuple(items)


def _is_coroutine_function(item: object) -> bool:
    return inspect.iscoroutinefunction(item) or (
        callable(item) and inspect.iscoroutinefunction(type(item).__call__)
    )


def _name(item: object) -> str:
    name = getattr(item, "__qualname__", None) or type(item).__qualname__
    return f"{name!s} ({item!r})" if not callable(item) else str(name)


async def run_through(middleware: Sequence[Middleware], task: Task, handler: CallNext) -> Any:
    """``handler()`` called through ``middleware`` (the first outermost); its value, as the
    outermost middleware returns it."""
    last = len(middleware)

    async def step(index: int) -> Any:
        if index == last:
            return await handler()
        return await middleware[index](task, lambda: step(index + 1))

    return await step(0)
