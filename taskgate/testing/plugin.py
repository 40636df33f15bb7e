"""taskgate's pytest plugin, active wherever taskgate is installed (a ``pytest11`` entry point).

Fixtures for an application's tests:

- ``taskgate_clock``: a `ManualClock` -- brokers built on it see time move only when the test
  (or `taskgate.testing.drain`) moves it;
- ``memory_broker``: a `MemoryBroker` on ``taskgate_clock``, closed after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskgate.brokers.memory import MemoryBroker
from taskgate.clock import ManualClock

__all__ = ["memory_broker", "taskgate_clock"]


@pytest.fixture
def taskgate_clock() -> ManualClock:
    """A `ManualClock` for the test's brokers: retries and delays take no real time."""
    return ManualClock()


@pytest.fixture
def memory_broker(taskgate_clock: ManualClock) -> Iterator[MemoryBroker]:
    """A `MemoryBroker` on ``taskgate_clock``, closed after the test."""
    broker = MemoryBroker(clock=taskgate_clock)
    yield broker
    broker.close()
