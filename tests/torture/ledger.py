"""Per-process ledgers: JSON lines appended with one ``write`` each, readable after a SIGKILL.

Each process writes its own file (no interleaving, no locks). A line is handed to the OS as
soon as it is written, so a process killed with SIGKILL loses nothing it recorded.

Times: ``mono`` is the host's CLOCK_MONOTONIC read by a raw system call (nanoseconds).
libfaketime, which skews the workers' clocks, replaces libc's clock functions but not the
system call, so ``mono`` is one clock for every process of the host, skewed or not, and the
checker orders events across processes on it. ``wall`` is the process's own (possibly skewed)
``time.time()``, for reading only.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

__all__ = ["Ledger", "mono_ns", "read_ledgers"]

_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}.get(platform.machine())
_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)


def mono_ns() -> int:
    """The host's monotonic clock in ns, past any LD_PRELOAD clock shim (see the module doc)."""
    if _CLOCK_GETTIME is None:  # an architecture this shim does not know: no skew is applied there
        return time.monotonic_ns()
    spec = _Timespec()
    if _libc.syscall(_CLOCK_GETTIME, _CLOCK_MONOTONIC, ctypes.byref(spec)) != 0:
        raise OSError(ctypes.get_errno(), "clock_gettime system call failed")
    return int(spec.tv_sec) * 1_000_000_000 + int(spec.tv_nsec)


class Ledger:
    """One process's ledger file; `record` appends one event."""

    def __init__(self, path: Path | str, process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, event: str, **fields: Any) -> None:
        """Append ``{"e": event, "proc": ..., "pid": ..., "mono": ..., "wall": ..., **fields}``."""
        line = {"e": event, "proc": self.process, "pid": os.getpid(), "mono": mono_ns(), "wall": time.time()}
        line.update(fields)
        os.write(self._fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        """Close the file (every line is already with the OS)."""
        os.close(self._fd)


def read_ledgers(directory: Path) -> list[dict[str, Any]]:
    """Every event of every ``*.jsonl`` in ``directory``, ordered by ``mono``.

    A line cut short by a kill mid-write (never seen in practice: each line is one ``write``)
    is skipped rather than failing the whole run.
    """
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    events.sort(key=lambda e: e["mono"])
    return events
