"""`drain`: run a gate until its work is done, moving a `ManualClock` past every wait.

For an application's tests: a task that retries twice with a back-off of minutes finishes in
milliseconds, because the broker's clock jumps to the next task's ``run_at`` (or the end of a
hold or of a spent quota window) whenever nothing is due or running.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio

from taskgate.clock import ManualClock, utc
from taskgate.gate import Gate
from taskgate.runtime.runner import Runtime
from taskgate.task import QueueStats, Status, Task

__all__ = ["drain"]

# How often drain looks at the store while work is due or running: the look is cheap, and the
# gate itself claims and settles without waiting for it.
LOOK_EVERY = 0.005
# Without a manual clock, drain waits for real time to reach the next task; it still looks
# this often (a task submitted meanwhile may be due sooner).
REAL_WAIT_MAX = 0.05
HELD_INDEFINITELY = datetime.max.replace(tzinfo=UTC)
WAITING = (Status.PENDING, Status.RETRYING)


@dataclass(frozen=True, slots=True)
class _Look:
    """What the store holds for the gate's handled types at one look."""

    running: tuple[Task, ...]
    due: tuple[Task, ...]
    next_at: datetime | None  # when the earliest waiting task becomes due; None: none will


async def drain(gate: Gate, *, timeout: float = 10.0, clock: ManualClock | None = None) -> list[Task]:  # noqa: ASYNC109 (SPEC name)
    """Run ``gate`` until none of its tasks is due or running; the tasks that finished meanwhile.

    Runs the gate for the call if it is not running already (and stops it again after, ready to
    run again), else waits for the running one. When nothing is due or running but tasks wait
    for a later time -- a ``delay``, a retry's back-off, a `Throttled`'s ``retry_after``, a
    timed pause or a spent quota window -- ``clock`` (default: the broker's own clock, when it
    is a `ManualClock`) is moved to that time, so none of it takes real time; without a manual
    clock drain waits for it. Only tasks of types the gate has handlers for count; a queue
    paused until resumed is left waiting. Returns the `Task` snapshots of every task that
    became final during the call, in the order they finished. Raises the built-in
    `TimeoutError` when work is still due or running after ``timeout`` seconds of real time.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"drain timeout must be a positive number of seconds, got {timeout!r}")
    manual = clock if clock is not None else _manual_clock_of(gate)
    runtime: Runtime = gate._runtime  # the runtime this helper drives alongside its gate
    before = {task.id for task in await gate.list() if task.status.is_final}
    late: TimeoutError | None = None
    async with anyio.create_task_group() as group:
        if not runtime.is_running:
            await group.start(gate.run)
        try:
            await _until_done(gate, runtime, manual, timeout)
        except TimeoutError as exc:
            late = exc  # raised once the gate has stopped, not from inside its task group
        finally:
            group.cancel_scope.cancel()
    if late is not None:
        raise late
    return _finished(await gate.list(), before)


def _manual_clock_of(gate: Gate) -> ManualClock | None:
    clock = getattr(gate.config.broker, "clock", None)
    return clock if isinstance(clock, ManualClock) else None


async def _until_done(gate: Gate, runtime: Runtime, clock: ManualClock | None, within: float) -> None:
    look: _Look | None = None
    try:
        with anyio.fail_after(within):
            while True:
                look = await _look(gate, runtime, clock)
                if look.running or look.due or not runtime.hooks.idle:
                    runtime.wake_all(new_work=True)
                    await anyio.sleep(LOOK_EVERY)
                elif look.next_at is None:
                    return
                elif clock is not None:
                    clock.set(max(look.next_at, clock.now()))
                    for name in list(runtime.schedulers):
                        runtime.resume_here(name)  # this process's own hold counts real seconds
                else:
                    left = (look.next_at - datetime.now(UTC)).total_seconds()
                    await anyio.sleep(min(max(left, LOOK_EVERY), REAL_WAIT_MAX))
    except TimeoutError:
        raise TimeoutError(_still_busy(look, within)) from None


async def _look(gate: Gate, runtime: Runtime, clock: ManualClock | None) -> _Look:
    handled = set(runtime.handlers)
    tasks = [task for task in await gate.list() if task.type in handled]
    now = clock.now() if clock is not None else datetime.now(UTC)
    running = tuple(task for task in tasks if task.status is Status.RUNNING)
    waiting = [task for task in tasks if task.status in WAITING]
    ready = {queue: await _ready_at(gate, queue) for queue in {task.queue for task in waiting}}
    due_at = [(task, _due_at(task, ready[task.queue])) for task in waiting]
    due = tuple(task for task, at in due_at if at is not None and at <= now)
    later = [at for _, at in due_at if at is not None and at > now]
    return _Look(running, due, min(later, default=None))


async def _ready_at(gate: Gate, queue: str) -> datetime | None:
    """When ``queue`` may start tasks again: its hold's end, or its spent quota window's end
    (None: it may now; `HELD_INDEFINITELY`: not until resumed)."""
    stats: QueueStats = await gate.stats(queue)
    ends = [stats.paused_until] if stats.paused_until is not None else []
    if stats.quota_exhausted and stats.quota_window_end is not None:
        ends.append(stats.quota_window_end)
    return max(ends, default=None)


def _due_at(task: Task, ready: datetime | None) -> datetime | None:
    """When ``task`` may start (None: not until its queue is resumed)."""
    if ready is None:
        return utc(task.run_at)
    if ready >= HELD_INDEFINITELY:
        return None
    return max(utc(task.run_at), ready)


def _still_busy(look: _Look | None, timeout: float) -> str:
    if look is None:
        return f"drain: the store did not answer within {timeout}s"
    running, due = _ids(look.running), _ids(look.due)
    return f"drain: work not done after {timeout}s (running: {running}; due: {due})"


def _ids(tasks: Sequence[Task]) -> str:
    shown = ", ".join(f"{task.type} {task.id}" for task in tasks[:5])
    return shown + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "") if tasks else "none"


def _finished(tasks: Iterable[Task], before: set[str]) -> list[Task]:
    done = [task for task in tasks if task.status.is_final and task.id not in before]
    return sorted(done, key=lambda task: (task.finished_at or task.created_at, task.id))
