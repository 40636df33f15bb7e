"""End-to-end processing of pre-filled no-op tasks: one worker process, or two.

A run fills the queue with ``n`` pending tasks (not timed), then times from starting the
gate(s) until the broker's counters show all ``n`` completed -- or, on a slow backend, until
``run_cap`` seconds have passed, taking the rate of what completed by then.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from typing import Any

import anyio

from benchmarks.common import Countdown, completed_parent, enqueue_noops, make_gate, wait_completed
from benchmarks.settings import Settings
from benchmarks.stores import Store, isolated_store

__all__ = ["LIMIT_VARIANTS", "process_in_process", "process_two_procs"]

# Limits set high enough never to bind: (queue options, depends_on a completed parent, tasks
# of mixed priorities). "none" is the default queue (its workers counted in the store where the
# broker can); "local" counts them in the process (``shared_limits=False``): what sharing them
# costs; "priorities" gives each task a priority from 0 to 9 at random (seeded): what claiming
# across priorities costs against the same tasks all at priority 0.
LIMIT_VARIANTS: dict[str, tuple[dict[str, Any], bool, bool]] = {
    "none": ({}, False, False),
    "local": ({"shared_limits": False}, False, False),
    "rps": ({"rps": 1_000_000}, False, False),
    "quota": ({"quota_limit": 1_000_000_000, "quota_period": "24h"}, False, False),
    "deps": ({}, True, False),
    "priorities": ({}, False, True),
}
PRIORITY_SEED = 39


def process_in_process(backend: str, s: Settings, *, workers: int = 10, variant: str = "none") -> float:
    """Tasks per second processed by one gate in this process (one run)."""
    options, deps, prioritized = LIMIT_VARIANTS[variant]
    with isolated_store(backend) as store:
        broker = store.open()
        parents = [completed_parent(broker)] if deps else []
        priorities = random.Random(PRIORITY_SEED) if prioritized else None
        enqueue_noops(broker, s.n, depends_on=parents, priorities=priorities)
        gate = make_gate(broker, workers=workers, **options)
        countdown = Countdown(s.n)
        gate.handle("noop", countdown)

        async def run() -> float:
            start = time.perf_counter()
            async with gate:
                with anyio.move_on_after(s.run_cap):
                    await countdown.done.wait()
                done, end = await anyio.to_thread.run_sync(
                    lambda: wait_completed(broker, s.n, poll=0.001, until=start + s.run_cap)
                )
            return done / (end - start)

        return anyio.run(run)


def process_two_procs(backend: str, s: Settings, *, workers: int = 10, processes: int = 2) -> float:
    """Tasks per second processed by ``processes`` worker processes sharing the store (one run)."""
    with isolated_store(backend) as store:
        broker = store.open()
        enqueue_noops(broker, s.n)
        children = [_spawn(store, workers) for _ in range(processes)]
        try:
            for child in children:
                _expect(child, "ready")
            start = time.perf_counter()
            for child in children:
                _send(child, "go")
            done, end = wait_completed(broker, s.n, poll=0.01, until=start + s.run_cap)
        finally:
            _stop_all(children)
        return done / (end - start)


def _spawn(store: Store, workers: int) -> subprocess.Popen[str]:
    options = json.dumps({"spec": store.spec, "workers": workers})
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.child", "process", options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _expect(child: subprocess.Popen[str], word: str) -> None:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != word:
        raise RuntimeError(f"benchmark child said {line!r}, expected {word!r} (exit code {child.poll()})")


def _send(child: subprocess.Popen[str], word: str) -> None:
    assert child.stdin is not None
    child.stdin.write(word + "\n")
    child.stdin.flush()


def _stop_all(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None and child.stdin is not None:
            try:
                child.stdin.write("stop\n")
                child.stdin.close()
            except BrokenPipeError:
                pass
    for child in children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
