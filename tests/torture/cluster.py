"""The processes of one run: workers (each behind its own proxy), producers, and their restarts.

Children run ``python -m torture.worker`` / ``torture.producer`` with ``tests/`` on
``PYTHONPATH``. A worker may start with a skewed clock: libfaketime (Debian ``faketime``)
preloaded with ``FAKETIME="+2.5s"`` shifts every clock the process reads through libc, wall
and monotonic alike, by a fixed offset for the process's lifetime. (Changing the offset of a
running process is not offered: libfaketime 0.9.10 then either jumps the process's monotonic
clock -- which no real host does -- or, with ``FAKETIME_DONT_FAKE_MONOTONIC``, fails every
``time.sleep`` with EINVAL.) So a skew fault is a worker (re)started with an offset.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ledger import Ledger
from .proxy import Proxy
from .stores import Store

__all__ = ["FAKETIME_LIBRARY", "Cluster"]

FAKETIME_LIBRARY = next(
    (
        str(p)
        for p in (
            Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"),
            Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"),
        )
        if p.exists()
    ),
    None,
)
TESTS = Path(__file__).resolve().parent.parent


def _child(
    module: str, spec: dict[str, Any], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    environment = {**os.environ, "PYTHONPATH": path, **(env or {})}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, json.dumps(spec)], env=environment, stdout=out, stderr=out
        )


@dataclass
class WorkerSlot:
    """One worker position: its proxy stays, its process comes and goes."""

    index: int
    proxy: Proxy | None
    process: subprocess.Popen[bytes] | None = None
    name: str = ""
    incarnation: int = 0
    skew: float = 0.0


@dataclass
class Cluster:
    """Workers and producers of one run, writing their ledgers into ``directory``."""

    store: Store
    directory: Path
    driver: Ledger
    inject_bug: str = ""
    slots: list[WorkerSlot] = field(default_factory=list)
    producers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Workers that ended without being killed or told to stop: "name: exit status" (a finding).
    unexpected_exits: list[str] = field(default_factory=list)

    def start_workers(self, count: int, skews: list[float]) -> None:
        for index in range(count):
            proxy = Proxy(self.store.port) if self.store.has_server else None
            slot = WorkerSlot(index, proxy)
            self.slots.append(slot)
            self.start_worker(slot, skews[index] if index < len(skews) else 0.0)

    def start_worker(self, slot: WorkerSlot, skew: float) -> None:
        slot.incarnation += 1
        slot.name = f"w{slot.index}.{slot.incarnation}"
        slot.skew = skew
        url = self.store.url(slot.proxy.port if slot.proxy else None)
        spec = {
            "url": url,
            "options": self.store.options,
            "ledger": str(self.directory / f"{slot.name}.jsonl"),
            "name": slot.name,
            "inject_bug": self.inject_bug,
        }
        env = {}
        if skew and FAKETIME_LIBRARY:
            env = {"LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": f"{skew:+.1f}s"}
        slot.process = _child("torture.worker", spec, self.directory / "workers.log", env)
        self.driver.record("worker_start", target=slot.name, pid=slot.process.pid, skew=skew)

    def kill(self, slot: WorkerSlot) -> None:
        """SIGKILL the slot's worker; the kill is stamped once the process is gone."""
        assert slot.process is not None
        if slot.process.poll() is not None:
            self.unexpected_exits.append(f"{slot.name}: exit status {slot.process.returncode}")
        slot.process.send_signal(signal.SIGKILL)
        slot.process.wait()
        self.driver.record("kill", target=slot.name)
        slot.process = None

    def start_producers(
        self, count: int, seed: int, per_producer: int, duration: float, long_rate: float, long_hold: float
    ) -> None:
        for index in range(count):
            spec = {
                "url": self.store.url(),
                "options": self.store.options,
                "ledger": str(self.directory / f"p{index}.jsonl"),
                "name": f"p{index}",
                "seed": seed,
                "index": index,
                "count": per_producer,
                "duration": duration,
                "long_rate": long_rate,
                "long_hold": long_hold,
            }
            self.producers.append(_child("torture.producer", spec, self.directory / "producers.log"))

    def ensure_workers(self) -> None:
        """Start any worker that is not running (after the faults end)."""
        for slot in self.slots:
            if slot.process is None or slot.process.poll() is not None:
                if slot.process is not None:  # it died on its own: a crash
                    self.unexpected_exits.append(f"{slot.name}: exit status {slot.process.returncode}")
                    self.driver.record("kill", target=slot.name)
                self.start_worker(slot, slot.skew)

    def stop_workers(self, timeout: float = 20.0) -> None:
        """SIGTERM every worker (a graceful shutdown); SIGKILL one that outlives ``timeout``."""
        for slot in self.slots:
            if slot.process is not None:
                slot.process.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.process is None:
                continue
            try:
                if slot.process.wait(timeout=timeout) != 0:
                    self.unexpected_exits.append(
                        f"{slot.name}: exit status {slot.process.returncode} on SIGTERM"
                    )
            except subprocess.TimeoutExpired:
                self.unexpected_exits.append(f"{slot.name}: still running {timeout:.0f} s after SIGTERM")
                self.kill(slot)
            slot.process = None
            if slot.proxy is not None:
                slot.proxy.close()

    def stop_all(self) -> None:
        """Kill whatever still runs (after an error in the driver)."""
        for process in [s.process for s in self.slots] + self.producers:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        for slot in self.slots:
            if slot.proxy is not None:
                slot.proxy.close()
