"""The seeded workload: the queues every process configures and each producer's plan.

Queues (one task type per queue, named alike):

- ``free``: independent tasks and fan-in chains (a child ``depends_on`` two or three parents);
- ``quota``: a hard quota of `QUOTA_LIMIT` starts per `QUOTA_PERIOD` window, submitted in
  bursts larger than a window's quota;
- ``shared``: shared ``workers``/``rps`` across processes and groups limited by
  ``group_workers``, with a few long tasks (longer than the lease: heartbeats keep them) that
  a partition turns into lease losses.

A task's behaviour is in its payload, so a run is reproducible from the seed: how long it
holds its slot, how many business failures it raises first (``fail``; ``max_retry`` decides
whether it ends failed), how many ``Throttled`` re-queues it asks for first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from taskgate import Backoff, Config, QueueConfig
from taskgate.brokers.base import Broker

__all__ = ["GROUPS", "LEASE_TTL", "QUEUES", "QUOTA_LIMIT", "QUOTA_PERIOD", "Item", "config", "plan"]

LEASE_TTL = 3.0  # seconds: a killed worker's tasks are back within 3-4.5 s
QUOTA_LIMIT, QUOTA_PERIOD = 5, 1.0
GROUPS = [f"g{i}" for i in range(5)]
LONG_HOLD = 4.0  # > LEASE_TTL: kept by heartbeats, lost to a partition
LEASE_LOST_MAX = 6

QUEUES: dict[str, QueueConfig] = {
    "free": QueueConfig(workers=4, lease_ttl=LEASE_TTL, backoff=Backoff(base=0.2, max=1)),
    "quota": QueueConfig(
        workers=2,
        lease_ttl=LEASE_TTL,
        quota_limit=QUOTA_LIMIT,
        quota_period=QUOTA_PERIOD,
        backoff=Backoff(base=0.2, max=1),
    ),
    "shared": QueueConfig(
        workers=3, rps=40, lease_ttl=LEASE_TTL, group_workers=1, backoff=Backoff(base=0.2, max=1)
    ),
}


def config(broker: Broker) -> Config:
    """The `Config` every process of a run uses (producers and workers alike)."""
    return Config(
        broker=broker,
        queues=QUEUES,
        routes={name: name for name in QUEUES},
        lease_lost_max=LEASE_LOST_MAX,
    )


@dataclass
class Item:
    """One planned submit: ``ref`` names it within its producer; ``parents`` are earlier refs."""

    ref: int
    type: str
    payload: dict[str, Any]
    max_retry: int = 0
    delay: float = 0.0
    group: str | None = None
    parents: list[int] = field(default_factory=list)


def _behaviour(
    rng: random.Random, key: str, *, long_rate: float, long_hold: float
) -> tuple[dict[str, Any], int]:
    hold = rng.uniform(0.02, 0.15)
    if rng.random() < long_rate:
        hold = long_hold
    fail = rng.choice([1, 1, 2, 3]) if rng.random() < 0.12 else 0
    max_retry = rng.randint(0, 2) if fail else rng.randint(0, 1)
    throttle = 1 if rng.random() < 0.08 else 0
    scope = "queue" if throttle and rng.random() < 0.1 else "task"
    return {"k": key, "hold": round(hold, 3), "fail": fail, "throttle": throttle, "scope": scope}, max_retry


def plan(
    seed: int, producer: int, count: int, long_rate: float = 0.03, long_hold: float = LONG_HOLD
) -> list[Item]:
    """About ``count`` submits for producer number ``producer``, the same for the same seed;
    ``long_rate`` of the ``shared`` tasks hold their slot ``long_hold`` seconds (longer than
    the lease)."""
    rng = random.Random(f"{seed}/{producer}")
    items: list[Item] = []

    def add(
        type_: str, *, group: str | None = None, parents: list[int] | None = None, long_ok: bool = False
    ) -> int:
        ref = len(items)
        payload, max_retry = _behaviour(
            rng, f"p{producer}-{ref}", long_rate=long_rate if long_ok else 0.0, long_hold=long_hold
        )
        delay = round(rng.uniform(0.2, 2.0), 3) if rng.random() < 0.1 else 0.0
        items.append(Item(ref, type_, payload, max_retry, delay, group, parents or []))
        return ref

    while len(items) < count:
        roll = rng.random()
        if roll < 0.35:
            add("free")
        elif roll < 0.50:
            parents = [add("free") for _ in range(rng.randint(2, 3))]
            add("free", parents=parents)
        elif roll < 0.55:  # a burst: more than a window's quota at once, so the quota binds
            for _ in range(rng.randint(6, 10)):
                add("quota")
        else:
            add("shared", group=rng.choice([*GROUPS, None]), long_ok=True)
    return items
