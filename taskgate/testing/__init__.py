"""Test helpers for taskgate users and broker authors: the broker contract suite.

A backend's test file subclasses `BrokerContract` and supplies a ``broker_factory`` fixture
(see `taskgate.testing.contract`); every contract test then runs against that backend. A
broker declaring ``capabilities.quiet_acks`` adds `QuietAckContract` too, one declaring
``capabilities.quiet_enqueue`` `QuietEnqueueContract`, one implementing
`taskgate.brokers.base.AckCarrier` `AckCarrierContract`.
"""

from __future__ import annotations

import pytest

# Plain asserts in the suite should explain themselves like asserts in test files do; this
# must run before the contract modules are imported.
pytest.register_assert_rewrite("taskgate.testing.contract")

from taskgate.testing.contract import (  # noqa: E402
    RACE_ROUNDS,
    AckCarrierContract,
    BrokerContract,
    QuietAckContract,
    QuietEnqueueContract,
)

__all__ = [
    "RACE_ROUNDS",
    "AckCarrierContract",
    "BrokerContract",
    "QuietAckContract",
    "QuietEnqueueContract",
]
