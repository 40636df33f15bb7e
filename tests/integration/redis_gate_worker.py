"""A `Gate` on the shared Redis in a child process, for ``test_redis_gate_limits.py``.

The test starts children with multiprocessing's ``spawn`` context (`serve` is the target).
Each child runs one Gate over a `RedisBroker` on the test's key prefix, serving type ``t`` on
queue ``q`` with one of the probe handlers below, until the broker counts ``total`` completed
tasks (or, with ``total=0``, until it is killed). Probes write what they see into keys under
the broker's base (``<base>probe:*``), so the test's key purge removes them too, and every
time they record is the Redis server's ``TIME``: one clock for every process.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import redis

from taskgate import Config, Gate, QueueConfig, Status, Task
from taskgate.brokers.params import Claim, Claimed, ItemAnswer, Settle
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.testing import steps

__all__ = ["CountingRedisBroker", "Probe", "WorkerSpec", "make_gate", "serve", "server_us"]

QUEUE, TYPE = "q", "t"
POLL = 0.01  # Gate.poll_interval of the children: idle processes retry slots and rate often
CHILD_DEADLINE = 60.0  # a child still short of ``total`` by then is hung, not slow
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOLD = 0.03  # how long a "live" handler keeps its slot: long enough for others to contend


def server_us(client: redis.Redis) -> int:
    """The Redis server's clock in µs (the clock the broker's scripts use)."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


@dataclass(frozen=True)
class WorkerSpec:
    """What one child runs: where, with which probe, under which limits, for how long."""

    url: str
    prefix: str
    probe: str  # a key of HANDLERS
    workers: int
    rps: float = 0
    lease_ttl: float = 60.0
    total: int = 0  # stop after this many completed tasks of type ``t``; 0 = run until killed
    backend: str = "asyncio"
    reap_interval: float | None = None


class Probe:
    """The keys a probe handler writes, named under the broker's base so the test purge finds them."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = redis.Redis.from_url(url)
        base = KeySpace(prefix).base
        self.live = f"{base}probe:live"  # SET of "<pid>:<task id>" running now
        self.snapshots = f"{base}probe:snapshots"  # LIST of "<member> <member>..." seen at each start
        self.starts = f"{base}probe:starts"  # LIST of "<pid> <claim time µs>"
        self.runs = f"{base}probe:runs"  # LIST of "<pid> <task id>", one per handler call
        self.started = f"{base}probe:started"  # STRING "<pid> <task id> <claims>" of a hanging handler

    def close(self) -> None:
        """Close the probe's connections."""
        self.client.close()


def _live(probe: Probe) -> Callable[[Task], None]:
    """Join the live set and record, atomically, everyone running at that instant."""

    def handler(task: Task) -> None:
        member = f"{os.getpid()}:{task.id}"
        # MULTI/EXEC: the snapshot is the set exactly as this SADD left it, so the largest
        # snapshot is the largest the set ever was (it only grows by such SADDs).
        pipe = probe.client.pipeline(transaction=True)
        pipe.sadd(probe.live, member)
        pipe.smembers(probe.live)
        _, members = pipe.execute()
        probe.client.rpush(probe.snapshots, b" ".join(sorted(members)))
        time.sleep(HOLD)  # the work: holds the slot so that the other process must contend
        probe.client.srem(probe.live, member)

    return handler


def _starts(probe: Probe) -> Callable[[Task], None]:
    """Record when the task started: its claim time, stamped by the claim script on the server clock.

    The claim follows the rate grant by one broker call, so these times jitter far less than
    times read inside the handler would.
    """

    def handler(task: Task) -> None:
        assert task.started_at is not None
        claimed_us = (task.started_at - EPOCH) // timedelta(microseconds=1)
        probe.client.rpush(probe.starts, f"{os.getpid()} {claimed_us}")

    return handler


def _runs(probe: Probe) -> Callable[[Task], None]:
    """Record one invocation."""

    def handler(task: Task) -> None:
        probe.client.rpush(probe.runs, f"{os.getpid()} {task.id}")

    return handler


def _hang(probe: Probe) -> Callable[[Task], None]:
    """Say it started, then block until the process is killed."""

    def handler(task: Task) -> None:
        probe.client.set(probe.started, f"{os.getpid()} {task.id} {task.claims}")
        threading.Event().wait()

    return handler


HANDLERS: dict[str, Callable[[Probe], Callable[[Task], None]]] = {
    "live": _live,
    "starts": _starts,
    "runs": _runs,
    "hang": _hang,
}


class CountingRedisBroker(RedisBroker):
    """A `RedisBroker` that tallies what the runtime asked of the shared limiter and got.

    The tallies show that a process really contended: which process wins each start is a race
    (fairness is not promised), but a process refused slots or starts was held back globally.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.tally: Counter[str] = Counter()

    def _count(self, what: str, asked: int, granted: int) -> None:
        with self._lock:
            self.tally[f"{what}_calls"] += 1
            self.tally[f"{what}_granted"] += granted
            self.tally[f"{what}_refused"] += asked - granted

    def claim(self, claim: Claim) -> Claimed:
        """`RedisBroker.claim`, counted: a plain claim's shortfall is an idle poll; a claim under
        shared limits is counted as `_count_limited` says (unless it failed after its acks)."""
        taken = super().claim(claim)
        if claim.shared is None:
            self._count("claim", claim.limit, len(taken.leases))
        elif taken.failed is None:
            self._count_limited(claim.queue, claim.limit, claim.shared.rps, taken)
        return taken

    def _count_limited(self, queue: str, limit: int, rps: float, taken: Claimed) -> None:
        """Slots: a shortfall while tasks were still queued and the rate held none back was for
        want of a slot (tasks leave the queue only by being claimed). Rate: a positive wait
        means the rate held at least one task back (counted as one refused start)."""
        got = len(taken.leases)
        held_by_rate = taken.retry_after > 0
        short_of_slots = got < limit and not held_by_rate and steps.queue_length(self, queue) > 0
        self._count("slots", limit, got if short_of_slots else limit)
        if rps > 0:
            self._count("rate", got + (1 if held_by_rate else 0), got)
        self._count("claim", limit, got)

    def settle(self, settle: Settle) -> list[ItemAnswer]:
        """`RedisBroker.settle`, counting the slots given back in a call of their own (not on a
        claim's ``release``)."""
        answers = super().settle(settle)
        if settle.give_back is not None and settle.give_back.slots:
            slots = len(settle.give_back.slots)
            self._count("release", slots, slots)
        return answers

    def wait_for_work(self, queues: Collection[str], timeout: float) -> bool:
        """`RedisBroker.wait_for_work`, counting the zero-timeout "is anything due?" probes."""
        due = super().wait_for_work(queues, timeout)
        if timeout == 0:
            self._count("probe", 1, int(due))
        return due


def make_gate(spec: WorkerSpec, broker: RedisBroker, probe: Probe) -> Gate:
    """The child's gate: queue ``q`` with the spec's limits, fast polling."""
    queue = QueueConfig(workers=spec.workers, rps=spec.rps, lease_ttl=spec.lease_ttl)
    gate = Gate(
        Config(broker=broker, queues={QUEUE: queue}, routes={TYPE: QUEUE}),
        poll_interval=POLL,
        reap_interval=spec.reap_interval,
    )
    gate.handle(TYPE, HANDLERS[spec.probe](probe))
    return gate


async def _run_until_done(gate: Gate, total: int) -> None:
    if total == 0:
        await gate.run()
        return
    async with gate:
        with anyio.fail_after(CHILD_DEADLINE):
            while True:
                if (await gate.overview()).get(TYPE, {}).get(Status.COMPLETED, 0) >= total:
                    return
                await anyio.sleep(POLL)


def serve(spec: WorkerSpec, barrier: Any, results: Any) -> None:
    """Child entry: build the gate, wait at ``barrier`` (if any), run, report to ``results``.

    The report is ``(pid, tally)``, the tally of `CountingRedisBroker`.
    """
    broker = CountingRedisBroker(spec.url, key_prefix=spec.prefix)
    probe = Probe(spec.url, spec.prefix)
    try:
        gate = make_gate(spec, broker, probe)
        if barrier is not None:
            barrier.wait(CHILD_DEADLINE)
        anyio.run(_run_until_done, gate, spec.total, backend=spec.backend)
    finally:
        probe.close()
        broker.close()
    if results is not None:
        results.put((os.getpid(), dict(broker.tally)))
