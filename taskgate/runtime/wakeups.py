"""Background loops of a running gate: the reaper, and wake-ups for work from other processes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from taskgate.errors import BrokerError

if TYPE_CHECKING:
    from taskgate.runtime.runner import Runtime

__all__ = ["WAIT_FOR_WORK_TIMEOUT", "reap_forever", "wait_for_work_forever"]

log = logging.getLogger("taskgate")

# How long one blocking `wait_for_work` call may last; an abandoned call (shutdown) lingers
# in its thread at most this long.
WAIT_FOR_WORK_TIMEOUT = 1.0
# A `wait_for_work` answer faster than this did not block: work was already due.
IMMEDIATE_ANSWER = 0.005
# The first pause after an immediate answer, in seconds.
FIRST_PAUSE = 0.01


async def reap_forever(runtime: Runtime, interval: float) -> None:
    """Every ``interval`` seconds, take back expired leases (``broker.reap``), then delete the
    final tasks past their retention (``broker.prune``)."""
    while True:
        await anyio.sleep(interval)
        await runtime.reap_once()
        await runtime.prune_once()


async def wait_for_work_forever(runtime: Runtime, poll_interval: float) -> None:
    """Block in a thread on ``broker.wait_for_work`` and wake the schedulers when it answers.

    Runs on its own one-thread limiter, so it never takes a broker-call thread. It asks only
    for idle queues (their last claim came back short): a queue working off a backlog claims
    again by itself whenever a worker frees, so while no queue is idle the loop waits for one
    to become idle instead of asking the broker -- a question per few milliseconds, in a
    thread that takes the GIL from the event loop, is what a busy gate can least afford.

    A wake that came after blocking (a notification from another process) is passed on at
    once; a broker answering "work is due" without blocking means the schedulers have not
    claimed it yet, so the loop pauses, doubling the pause up to ``poll_interval`` while the
    answers stay immediate, rather than spin.
    """
    limiter = anyio.CapacityLimiter(1)
    pause = FIRST_PAUSE
    while True:
        queues = sorted(name for name, scheduler in runtime.schedulers.items() if scheduler.idle)
        if not queues:
            await runtime.queue_idle.wait(poll_interval)
            continue
        asked = anyio.current_time()
        try:
            woke = await anyio.to_thread.run_sync(
                runtime.broker.wait_for_work,
                queues,
                WAIT_FOR_WORK_TIMEOUT,
                abandon_on_cancel=True,
                limiter=limiter,
            )
        except BrokerError as exc:
            log.warning("wait_for_work failed: %s", exc)
            woke = False
            await anyio.sleep(max(poll_interval, 0.5))
        if not woke:
            continue
        runtime.wake_all(new_work=True)
        if anyio.current_time() - asked >= IMMEDIATE_ANSWER:
            pause = FIRST_PAUSE
            continue
        await anyio.sleep(pause)
        pause = min(pause * 2, poll_interval)
