"""An LLM pipeline on taskgate: retrieve -> generate -> score, with a rate-limited, flaky gateway.

Each chain is three dependent tasks. ``retrieve`` and ``score`` run on the ``cpu`` queue;
``generate`` runs on the ``llm`` queue, limited to 2 concurrent calls and 3 starts per second,
against a simulated in-process gateway that sometimes answers "busy" (the handler raises
`Throttled`, which retries without spending an attempt) and sometimes fails (a business
failure, retried with exponential backoff up to ``max_retry``).

Run it::

    python examples/llm_pipeline.py                     # SQLite file llm_pipeline.db (or memory)
    python examples/llm_pipeline.py --chains 30 --broker memory://
    python examples/llm_pipeline.py --broker postgresql+psycopg://user@host/db

It prints a progress line twice a second and a summary at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

import taskgate
from taskgate import Config, Gate, QueueConfig, SkipRetry, Status, Task, TaskFailedError, Throttled
from taskgate.brokers import Broker, open_broker

DEFAULT_SQLITE_URL = "sqlite:///llm_pipeline.db"


class GatewayBusy(Exception):
    """The gateway said 429: come back after ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"busy, retry after {retry_after}s")
        self.retry_after = retry_after


class GatewayError(Exception):
    """The gateway answered 500."""


@dataclass
class FakeGateway:
    """A simulated LLM endpoint: some latency, some "busy" answers, some failures (seeded)."""

    busy_rate: float = 0.25
    fail_rate: float = 0.1
    seed: int = 7
    calls: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    async def complete(self, prompt: str) -> str:
        """Answer ``prompt``, or raise `GatewayBusy` / `GatewayError`."""
        self.calls += 1
        await anyio.sleep(self.rng.uniform(0.01, 0.05))
        roll = self.rng.random()
        if roll < self.busy_rate:
            raise GatewayBusy(retry_after=0.2)
        if roll < self.busy_rate + self.fail_rate:
            raise GatewayError("upstream returned 500")
        return f"answer to {prompt!r}"


@dataclass
class Progress:
    """Live state of this run's tasks, fed by ``on_state_change``."""

    status: dict[str, Status] = field(default_factory=dict)
    retries: Counter[str] = field(default_factory=Counter)

    def on_state_change(self, task: Task) -> None:
        """Record the new status; count retries by the kind of failure that caused them."""
        self.status[task.id] = task.status
        if task.status is Status.RETRYING:
            kind = "throttled" if (task.last_error or "").startswith("Throttled") else "business"
            self.retries[kind] += 1

    def line(self, elapsed: float) -> str:
        """One progress line: counts per status."""
        counts = Counter(s.value for s in self.status.values())
        parts = " ".join(f"{name}={counts[name]}" for name in sorted(counts))
        return f"[{elapsed:5.1f}s] {parts}"


def build_gate(broker: Broker, gateway: FakeGateway, progress: Progress) -> Gate:
    """The gate and its three handlers."""
    gate = Gate(
        Config(
            broker=broker,
            queues={"cpu": QueueConfig(workers=4), "llm": QueueConfig(workers=2, rps=3)},
            routes={"retrieve": "cpu", "generate": "llm", "score": "cpu"},
            on_state_change=progress.on_state_change,
        )
    )

    @gate.handler("retrieve")
    def retrieve(task: Task) -> dict[str, Any]:  # plain def: runs in a worker thread
        question = task.json()["question"]
        return {"question": question, "documents": [f"doc-{hash(question) % 97}", "doc-faq"]}

    @gate.handler("generate")
    async def generate(task: Task) -> dict[str, Any]:
        context = (await gate.get(task.depends_on[0])).result_json()
        try:
            answer = await gateway.complete(context["question"])
        except GatewayBusy as busy:
            raise Throttled(retry_after=busy.retry_after) from busy
        return {"question": context["question"], "answer": answer}

    @gate.handler("score")
    async def score(task: Task) -> dict[str, Any]:
        generated = (await gate.get(task.depends_on[0])).result_json()
        if not generated.get("answer"):
            raise SkipRetry("nothing to score")
        return {"question": generated["question"], "score": round(len(generated["answer"]) / 100, 2)}

    return gate


async def submit_chains(gate: Gate, chains: int) -> list[str]:
    """Submit ``chains`` retrieve -> generate -> score chains; returns the ids of every task."""
    ids: list[str] = []
    for n in range(chains):
        rid = await gate.submit("retrieve", {"question": f"question {n}"})
        gid = await gate.submit("generate", None, depends_on=[rid], max_retry=3)
        sid = await gate.submit("score", None, depends_on=[gid])
        ids += [rid, gid, sid]
    return ids


async def report_progress(progress: Progress, started: float, out: Any) -> None:
    """Print a progress line every half second (until cancelled)."""
    while True:
        await anyio.sleep(0.5)
        print(progress.line(time.monotonic() - started), file=out, flush=True)


async def run_pipeline(
    broker: Broker, chains: int, *, seed: int = 7, out: Any = sys.stdout
) -> dict[str, Any]:
    """Run the pipeline to the end and return the summary it prints."""
    gateway, progress = FakeGateway(seed=seed), Progress()
    gate = build_gate(broker, gateway, progress)
    started = time.monotonic()
    async with gate, anyio.create_task_group() as tg:
        tg.start_soon(report_progress, progress, started, out)
        ids = await submit_chains(gate, chains)
        for task_id in ids[2::3]:
            try:
                await gate.wait(task_id)
            except TaskFailedError:
                pass  # counted in the summary
        tg.cancel_scope.cancel()
    return await summarize(gate, ids, time.monotonic() - started, gateway, out)


async def summarize(
    gate: Gate, ids: Sequence[str], elapsed: float, gateway: FakeGateway, out: Any
) -> dict[str, Any]:
    """Final counts per status, throughput and retries by kind, read back from the broker."""
    tasks = [await gate.get(task_id) for task_id in ids]
    statuses = Counter(t.status.value for t in tasks)
    retries = {
        "business": sum(t.attempts for t in tasks),
        "throttled": sum(t.throttled for t in tasks),
        "lease_lost": sum(t.lease_lost for t in tasks),
    }
    chains_done = sum(1 for t in tasks[2::3] if t.status is Status.COMPLETED)
    summary = {
        "tasks": len(tasks),
        "statuses": dict(statuses),
        "chains_completed": chains_done,
        "elapsed_s": round(elapsed, 2),
        "throughput_tasks_per_s": round(statuses.get("completed", 0) / elapsed, 2) if elapsed else 0.0,
        "retries": retries,
        "gateway_calls": gateway.calls,
    }
    print("\nsummary", file=out)
    print(
        f"  tasks       {len(tasks)} ({', '.join(f'{k}={v}' for k, v in sorted(statuses.items()))})", file=out
    )
    print(f"  chains      {chains_done}/{len(tasks) // 3} completed in {elapsed:.1f}s", file=out)
    print(f"  throughput  {summary['throughput_tasks_per_s']} tasks/s", file=out)
    print(f"  retries     {', '.join(f'{k}={v}' for k, v in retries.items())}", file=out)
    print(f"  gateway     {gateway.calls} calls", file=out)
    return summary


def default_broker_url() -> str:
    """SQLite when the SQL broker is installed, else the in-process memory broker."""
    return DEFAULT_SQLITE_URL if importlib.util.find_spec("taskgate.brokers.sql") else "memory://"


def main(argv: Sequence[str] | None = None, out: Any = sys.stdout) -> dict[str, Any]:
    """Parse arguments, run the pipeline, print and return the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--broker", default=None, help=f"broker URL (default {DEFAULT_SQLITE_URL} or memory://)"
    )
    parser.add_argument("--chains", type=int, default=12, help="how many retrieve->generate->score chains")
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated gateway")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio", help="anyio backend")
    args = parser.parse_args(argv)
    if args.chains < 1:
        parser.error("--chains must be >= 1")
    url = args.broker or default_broker_url()
    broker = open_broker(url)
    print(f"taskgate {taskgate.__version__}: {args.chains} chains on {url}", file=out)
    try:
        return anyio.run(
            lambda: run_pipeline(broker, args.chains, seed=args.seed, out=out), backend=args.backend
        )
    finally:
        broker.close()


if __name__ == "__main__":
    main()
