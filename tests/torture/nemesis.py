"""The nemesis: a driver thread that injects the profile's faults at seeded random times.

Faults: ``kill`` (SIGKILL a worker, restart it -- sometimes with a skewed clock -- a moment
later), ``restart`` (crash the store's private server and start it again), and through a
worker's proxy: ``cut`` (every connection of one worker, or of all), ``delay`` (added latency
for a few seconds) and ``half_open`` (one direction stops for 1-6 s: longer than the lease, a
worker cannot renew and must fence itself). SQLite gets kills only.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .cluster import FAKETIME_LIBRARY, Cluster
from .ledger import Ledger, mono_ns
from .proxy import DOWN, UP
from .workload import LEASE_TTL

__all__ = ["Nemesis", "Profile"]


def _long_run_started(ledger: Path) -> bool:
    """Whether the worker of ``ledger`` started, in the last second, a run longer than the lease
    that is still going."""
    if not ledger.exists():
        return False
    events = [json.loads(line) for line in ledger.read_text().splitlines() if line.endswith("}")]
    ended = {(e["id"], e["claim"]) for e in events if e["e"] == "end"}
    now = mono_ns()
    return any(
        e["e"] == "start"
        and e["hold"] > LEASE_TTL
        and (e["id"], e["claim"]) not in ended
        and now - e["mono"] < 1_000_000_000
        for e in events
    )


SKEWS = (-4.0, -2.0, 2.0, 4.0)  # seconds; leases are 3 s, quota windows 1 s


@dataclass(frozen=True)
class Profile:
    """How much of everything one backend's run gets."""

    name: str
    tasks: int
    duration: float  # seconds over which producers spread their submits
    kills: int
    restarts: int
    proxy_faults: int
    settle: float  # the bound on settling once faults stop
    long_rate: float = 0.03
    long_hold: float = 4.0
    bug_partitions: int = 0  # extra long half-opens (the injected-bug run)


PROFILES = {
    "short": Profile("short", tasks=300, duration=18, kills=3, restarts=2, proxy_faults=5, settle=60),
    "long": Profile("long", tasks=2200, duration=240, kills=24, restarts=4, proxy_faults=30, settle=180),
    "bug": Profile(
        "bug",
        tasks=150,
        duration=15,
        kills=0,
        restarts=0,
        proxy_faults=0,
        settle=60,
        long_rate=0.15,
        long_hold=8.0,
        bug_partitions=4,
    ),
}


class Nemesis(threading.Thread):
    """Runs the schedule of `plan` against ``cluster`` until it ends or `stop` is called."""

    def __init__(self, cluster: Cluster, profile: Profile, rng: random.Random, driver: Ledger) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.cluster, self.profile, self.rng, self.driver = cluster, profile, rng, driver
        self.has_server = cluster.store.has_server
        self.skew = self.has_server and FAKETIME_LIBRARY is not None
        self.done = Counter[str]()
        self.errors: list[str] = []
        self._halt = threading.Event()
        self.schedule = self._plan()

    def _plan(self) -> list[tuple[float, str]]:
        p, rng = self.profile, self.rng
        span = (0.05 * p.duration, 0.9 * p.duration)
        kinds = ["kill"] * p.kills
        if self.has_server:
            kinds += ["restart"] * p.restarts
            kinds += [rng.choice(["cut", "delay", "half_open"]) for _ in range(p.proxy_faults)]
            kinds += ["partition"] * p.bug_partitions
        schedule = [(rng.uniform(*span), kind) for kind in kinds]
        if p.restarts and self.has_server:  # restarts spread evenly, so each finds work under way
            restarts = [span[0] + (i + 0.5) * (span[1] - span[0]) / p.restarts for i in range(p.restarts)]
            schedule = [s for s in schedule if s[1] != "restart"] + [(t, "restart") for t in restarts]
        return sorted(schedule)

    def stop(self) -> None:
        """Stop after the fault under way."""
        self._halt.set()

    def run(self) -> None:
        start = time.monotonic()
        for at, kind in self.schedule:
            if self._halt.wait(max(0.0, start + at - time.monotonic())):
                return
            try:
                getattr(self, f"_{kind}")()
                self.done[kind] += 1
            except Exception as exc:  # a fault that failed is reported (and fails the run), the rest go on
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                self.driver.record("fault_error", kind=kind, error=str(exc)[:300])

    def _kill(self) -> None:
        slot = self.rng.choice([s for s in self.cluster.slots if s.process is not None])
        self.driver.record("fault", kind="kill", target=slot.name)
        self.cluster.kill(slot)
        time.sleep(self.rng.uniform(0.2, 1.0))
        skew = self.rng.choice(SKEWS) if self.skew and self.rng.random() < 0.5 else 0.0
        if skew:
            self.done["skew"] += 1
        self.cluster.start_worker(slot, skew)

    def _restart(self) -> None:
        self.driver.record("fault", kind="restart")
        began = time.monotonic()
        self.cluster.store.restart()
        self.driver.record("fault_end", kind="restart", seconds=round(time.monotonic() - began, 2))

    def _cut(self) -> None:
        slots = self.cluster.slots if self.rng.random() < 0.5 else [self.rng.choice(self.cluster.slots)]
        for slot in slots:
            assert slot.proxy is not None
            slot.proxy.cut()
        self.driver.record("fault", kind="cut", target=[s.name for s in slots])

    def _delay(self) -> None:
        slot = self.rng.choice(self.cluster.slots)
        assert slot.proxy is not None
        latency, for_ = self.rng.uniform(0.05, 0.4), self.rng.uniform(2, 6)
        slot.proxy.delay(latency, for_)
        self.driver.record("fault", kind="delay", target=slot.name, latency=latency, seconds=for_)

    def _half_open(self, for_: float | None = None, direction: str | None = None) -> None:
        slot = self.rng.choice(self.cluster.slots)
        assert slot.proxy is not None
        direction = direction or self.rng.choice([UP, DOWN])
        for_ = for_ if for_ is not None else self.rng.uniform(1, 6)
        slot.proxy.half_open(direction, for_)
        self.driver.record("fault", kind="half_open", target=slot.name, direction=direction, seconds=for_)

    def _partition(self) -> None:
        """Cut off, for longer than the lease, a worker that has just started a long run:
        requests stop reaching the store (answers would still renew the lease), so the lease
        is lost while the run has seconds to go."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self._halt.is_set():
            for slot in self.cluster.slots:
                if slot.proxy is not None and _long_run_started(
                    self.cluster.directory / f"{slot.name}.jsonl"
                ):
                    slot.proxy.half_open(UP, 7.0)
                    self.driver.record("fault", kind="partition", target=slot.name, seconds=7.0)
                    return
            time.sleep(0.1)
        raise RuntimeError("no long run started within 20 s to partition")
