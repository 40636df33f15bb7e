"""CPU instructions the Redis server spends per task: a second ``redis-server`` under valgrind.

``python -m benchmarks.servercount [-n 1000] [--only claim,ack,process,submit]`` starts
``redis-server`` under ``valgrind --tool=callgrind`` on a free port, runs taskgate's Redis
broker against it and prints, per phase, the instructions the server spent in its commands
(``processCommand``, inclusive: the scripts and what they call; not the idle timer or socket
I/O) divided by the tasks of that phase:

- ``claim``: ``claim(10)`` until the queue of ``n`` tasks is empty;
- ``ack``: ``ack_many_quiet`` of those leases, ten at a time;
- ``process``: a gate with ``workers=10`` running ``n`` no-op tasks (``process.w10``);
- ``submit``: ``n`` single ``gate.submit`` calls, then ``submit_many`` batches of 1,000.

Timed figures drift by a fifth within minutes on this machine; these counts repeat to 0.1 %
(``submit_many``: 1 %), so a change to a script shows here even when a timed A/B cannot tell.
valgrind slows the server some fifty times: the rates printed alongside mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import anyio
import redis

import benchmarks.processing as processing
from benchmarks import stores
from benchmarks.common import QUEUE, enqueue_noops, make_gate
from benchmarks.settings import Settings

__all__ = ["CountedServer", "main"]

PHASES = ("claim", "ack", "process", "submit")  # submit prints submit.single and submit.batch
TTL = timedelta(seconds=60)


class CountedServer:
    """A ``redis-server`` under callgrind: `zero` the counts, run something, `read` them."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir}/cg.%p.out", "redis-server",
             "--port", str(self.port), "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 120  # valgrind takes seconds to start the server
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server under valgrind did not start") from None
                time.sleep(0.2)
        client.close()

    def _control(self, flag: str) -> None:
        subprocess.run(["callgrind_control", flag, str(self.process.pid)], capture_output=True, check=True)

    def zero(self) -> None:
        """Forget every count so far."""
        self._control("-z")

    def read(self) -> int:
        """Instructions spent in commands since `zero`."""
        before = set(glob.glob(f"{self.workdir}/cg.*"))
        self._control("-d")
        dumps: list[str] = []
        for _ in range(100):  # the dump is written by the server's next tick
            dumps = sorted(set(glob.glob(f"{self.workdir}/cg.*")) - before, key=os.path.getmtime)
            if dumps:
                break
            time.sleep(0.1)
        if not dumps:
            raise RuntimeError(f"callgrind wrote no dump into {self.workdir}")
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dumps[-1]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for line in report.splitlines():
            if ":processCommand [" in line:  # inclusive: every command and the scripts' calls
                return int(line.split()[0].replace(",", ""))
        return 0  # no command ran

    def stop(self) -> None:
        """Shut the server down and wait for valgrind to exit."""
        with contextlib.suppress(redis.RedisError):
            redis.Redis.from_url(self.url).shutdown(nosave=True)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


@contextlib.contextmanager
def counted_server() -> Iterator[CountedServer]:
    """A `CountedServer` that the benchmark stores use for Redis while the block runs."""
    with tempfile.TemporaryDirectory(prefix="taskgate-servercount-") as workdir:
        server = CountedServer(workdir)
        saved = stores.REDIS_URL
        stores.REDIS_URL = server.url
        try:
            yield server
        finally:
            stores.REDIS_URL = saved
            server.stop()


def _claim_and_ack(server: CountedServer, n: int, phases: Sequence[str]) -> dict[str, float]:
    counts: dict[str, float] = {}
    with stores.isolated_store("redis") as store:
        broker = store.open()
        enqueue_noops(broker, n)
        broker.claim(QUEUE, 1, TTL)  # loads the library; its task is left out of the counts
        batches = []
        server.zero()
        while batch := broker.claim(QUEUE, 10, TTL):
            batches.append(batch)
        claimed = sum(map(len, batches))
        counts["claim"] = server.read() / claimed
        server.zero()
        for batch in batches:
            broker.ack_many_quiet([(lease.task.id, lease.token, None) for lease in batch])
        counts["ack"] = server.read() / claimed
    return {phase: value for phase, value in counts.items() if phase in phases}


def _process(server: CountedServer, n: int) -> float:
    """`processing.process_in_process` with the counts zeroed after the fill and read at the end."""
    make_gate, wait_completed = processing.make_gate, processing.wait_completed
    spent = 0

    def zeroed_gate(*args: Any, **kwargs: Any) -> Any:
        server.zero()
        return make_gate(*args, **kwargs)

    def read_when_done(*args: Any, **kwargs: Any) -> Any:
        nonlocal spent
        done = wait_completed(*args, **kwargs)
        spent = server.read()
        return done

    processing.make_gate, processing.wait_completed = zeroed_gate, read_when_done  # type: ignore[assignment]
    try:
        processing.process_in_process("redis", Settings(n=n, run_cap=3600.0))
    finally:
        processing.make_gate, processing.wait_completed = make_gate, wait_completed  # type: ignore[assignment]
    return spent / n


def _submit(server: CountedServer, n: int) -> dict[str, float]:
    batches = max(1, n // 1000)
    counts: dict[str, float] = {}
    with stores.isolated_store("redis") as store:
        gate = make_gate(store.open())

        async def run() -> None:
            await gate.submit(QUEUE)  # loads the library
            server.zero()
            for _ in range(n):
                await gate.submit(QUEUE)
            counts["submit.single"] = server.read() / n
            server.zero()
            for _ in range(batches):
                await gate.submit_many(QUEUE, [None] * 1000)
            counts["submit.batch"] = server.read() / (batches * 1000)

        anyio.run(run)
    return counts


def count(n: int, phases: Sequence[str]) -> dict[str, float]:
    """Server instructions per task of each of ``phases`` (see the module), ``n`` tasks each."""
    counts: dict[str, float] = {}
    with counted_server() as server:
        if "claim" in phases or "ack" in phases:
            counts.update(_claim_and_ack(server, n, phases))
        if "process" in phases:
            counts["process"] = _process(server, n)
        if "submit" in phases:
            counts.update(_submit(server, n))
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    """Count the phases asked for and print one line each: server instructions per task."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.servercount")
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--only", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    args = p.parse_args(argv)
    phases = [phase.strip() for phase in args.only.split(",") if phase.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        p.error(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    for phase, value in count(args.n, phases).items():
        print(f"{phase:<14} {value:>12,.0f} server instructions per task")


if __name__ == "__main__":
    main()
