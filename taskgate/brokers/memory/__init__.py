"""The memory broker: every task in this process's memory, guarded by one lock.

A real backend, not a test double: claims pop from per-queue heaps, counts come from
maintained counters, and `wait_for_work` sleeps on a condition that submits notify. Nothing
survives the process and no other process sees the tasks (``cross_process=False``).
"""

from __future__ import annotations

from taskgate.brokers.memory.broker import MemoryBroker

__all__ = ["MemoryBroker"]
