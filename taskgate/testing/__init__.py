"""Test helpers for taskgate users and broker authors.

An application's tests: `drain` runs a gate until its work is done, moving a `ManualClock`
past every delay, back-off and throttle; `make_task` builds the `Task` a handler is called
with; the pytest plugin (`taskgate.testing.plugin`, active once taskgate is installed) gives
the fixtures ``taskgate_clock`` and ``memory_broker``.

A broker's test file subclasses `BrokerContract` and gives it a ``broker_factory`` fixture;
every contract case then runs against that broker, its optional cases chosen by what
``broker.capabilities`` declares (no opt-in classes). A third-party broker needs no more
than this::

    import pytest

    from taskgate.testing import BrokerContract, BrokerFactory, ManualClock

    from my_package import MyBroker


    class TestMyBroker(BrokerContract):
        @pytest.fixture
        def broker_factory(self, clock: ManualClock) -> Iterator[BrokerFactory]:
            opened: list[MyBroker] = []

            def open_broker() -> MyBroker:  # a NEW broker on the test's ONE store, on `clock`
                broker = MyBroker(store_for_this_test, clock=clock)
                opened.append(broker)
                return broker

            yield open_broker
            for broker in opened:
                broker.close()

A broker whose object is its store (in-process) may answer every call with the same object.
For a broker's own tests: `steps` makes one transition per call in the shape a test reads
best (``steps.claim(broker, "q", 1, ttl)``), `new_task` builds a task with a fresh id,
`claim_many` submits and claims ``n`` tasks, and `RACE_ROUNDS` is how often the suite repeats
each race.
"""

from __future__ import annotations

import pytest

# Plain asserts in the suite should explain themselves like asserts in test files do; this
# must run before the contract modules are imported.
pytest.register_assert_rewrite("taskgate.testing.contract")

from taskgate.clock import ManualClock  # noqa: E402
from taskgate.testing import steps  # noqa: E402
from taskgate.testing.contract import RACE_ROUNDS, BrokerContract, BrokerFactory  # noqa: E402
from taskgate.testing.contract._support import claim_many, new_task  # noqa: E402
from taskgate.testing.drain import drain  # noqa: E402
from taskgate.testing.tasks import make_task  # noqa: E402

__all__ = [
    "RACE_ROUNDS",
    "BrokerContract",
    "BrokerFactory",
    "ManualClock",
    "claim_many",
    "drain",
    "make_task",
    "new_task",
    "steps",
]
