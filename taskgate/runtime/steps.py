"""`step`: a handler's durable step -- its work done once per task, its result kept on the broker.

The first run of step ``name`` calls ``fn`` and stores its JSON result under (task id, name)
(`Broker.step`, first writer wins); any later run of the same task -- after a crash, a lost
lease or a retry -- gets the stored result back without calling ``fn``. On a task's first claim
(`Task.first_run`) nothing can be stored yet, so the step skips the read and costs one broker
call; later runs read first. The result a step answers is always the stored JSON decoded, on
the first run too, so every run of a handler sees the same value (a tuple comes back a list).
Two runs at once -- a sync handler still going in its abandoned thread after its lease was lost,
and the run that took the task back -- may both call ``fn`` before either stored; the first
result stored is the one both get.

Within one run, a name used again with equal arguments answers the result it already has (no
call, no broker round trip); with other arguments it raises `ValueError`, since a later run
would hand the second call the first one's result. Arguments are not stored: a later run gets
the stored result whatever arguments it passes. Steps belong to one execution: a replay is a
new execution and runs its steps afresh; retention deletes a task's steps with it.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio.from_thread
import anyio.to_thread

from taskgate.brokers.base import check_identifier
from taskgate.brokers.params import Step
from taskgate.runtime.context import RunContext, current_context

__all__ = ["step", "step_sync"]


@dataclass(frozen=True, slots=True)
class _Done:
    """A step this run already has: the arguments it was called with, and its stored JSON."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: bytes


async def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` as the durable step ``name`` of the running task: the first
    time, call it and store its JSON result; any later run of the task returns the stored
    result without calling ``fn``.

    An ``async def`` ``fn`` is awaited; a plain one runs in a worker thread (it is most often a
    blocking client's call), and what it returns is awaited if awaitable. ``name`` used again
    in the same run with equal arguments returns the same result; with other arguments it
    raises `ValueError`. Raises
    `NoTaskError` (a `RuntimeError`) outside a handler; `TypeError` for a result JSON cannot
    encode and `ValueError` for NaN or one over 1 MiB encoded (nothing stored); what ``fn``
    raises, and a `BrokerError` of the broker call, as any handler exception (the task retries
    by its policy). For plain ``def`` handlers use `step_sync`.
    """
    ctx = current_context("taskgate.step()")
    known = _recall(ctx, name, fn, args, kwargs)
    if known is not None:
        return json.loads(known)
    stored = None
    if not ctx.task.first_run:
        stored = await ctx.calls(ctx.broker.step, Step(ctx.task.id, name), deadline=ctx.deadline)
    if stored is None:
        if inspect.iscoroutinefunction(fn):
            value = await fn(*args, **kwargs)
        else:  # most likely a blocking client call: kept off the event loop
            value = await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
            if inspect.isawaitable(value):
                value = await value
        ran = Step(ctx.task.id, name, _encoded(name, value))
        stored = await ctx.calls(ctx.broker.step, ran, deadline=ctx.deadline)
    return _remembered(ctx, name, args, kwargs, stored)


def step_sync(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`step` for plain ``def`` handlers, which run in a worker thread; same rules and errors.

    A plain ``fn`` runs in the handler's thread, an ``async def`` one on the event loop. A
    handler whose lease was lost or whose task was canceled gets `LeaseLostError` or
    `TaskCanceledError` here before ``fn`` runs (its thread cannot be interrupted otherwise).
    """
    ctx = current_context("taskgate.step_sync()")
    known = _recall(ctx, name, fn, args, kwargs)
    if known is not None:
        return json.loads(known)
    ctx.raise_if_stopped()
    stored = None
    if not ctx.task.first_run:
        stored = _call_broker(ctx, Step(ctx.task.id, name))
    if stored is None:
        if inspect.iscoroutinefunction(fn):
            value = anyio.from_thread.run(functools.partial(fn, *args, **kwargs))
        else:
            value = fn(*args, **kwargs)
        stored = _call_broker(ctx, Step(ctx.task.id, name, _encoded(name, value)))
    return _remembered(ctx, name, args, kwargs, stored)


def _call_broker(ctx: RunContext, params: Step) -> bytes | None:
    """`Broker.step` from a handler's thread, through the runtime's broker calls."""
    return anyio.from_thread.run(lambda: ctx.calls(ctx.broker.step, params, deadline=ctx.deadline))


def _recall(
    ctx: RunContext, name: str, fn: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bytes | None:
    """The result of step ``name`` if this run has it already (called with equal arguments);
    `ValueError` if it was called with others; None when this run has not called it yet."""
    check_identifier(name, what="step name")
    if not callable(fn):
        raise TypeError(f"step {name!r} needs a callable, got {type(fn).__name__}: {fn!r}")
    done = None if ctx.steps is None else ctx.steps.get(name)
    if done is None:
        return None
    if done.args == args and done.kwargs == kwargs:
        result: bytes = done.result
        return result
    raise ValueError(
        f"step {name!r} was already run in this run with other arguments; "
        "give each different operation a name of its own"
    )


def _remembered(
    ctx: RunContext, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], stored: bytes | None
) -> Any:
    """Note step ``name``'s stored result for the rest of the run; the result, decoded."""
    assert stored is not None, "a step's store answers what is stored"
    if ctx.steps is None:
        ctx.steps = {}
    ctx.steps[name] = _Done(args, kwargs, stored)
    return json.loads(stored)


def _encoded(name: str, value: Any) -> bytes:
    """``value`` as compact ASCII JSON; `TypeError`/`ValueError` naming the step if it is not
    JSON (NaN and infinity are not)."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f"step {name!r} returned a value that is not JSON-encodable: {exc}") from None
