"""The broker contract suite: one pytest class stating every behaviour a broker must have.

Use it from a backend's test file::

    import pytest
    from taskgate.testing import BrokerContract

    class TestMyBroker(BrokerContract):
        @pytest.fixture
        def broker_factory(self, clock):
            store = ...                        # ONE isolated store for this test
            opened = []
            def open_broker():                 # each call: a NEW broker on that store
                broker = MyBroker(..., clock=clock)
                opened.append(broker)
                return broker
            yield open_broker
            for broker in opened:
                broker.close()

Tests are synchronous and never sleep: time moves on the ``clock`` fixture (a `ManualClock`)
which every broker of the factory must read for every time it stores or compares. Races run
real threads released by a barrier, one broker object per thread, `RACE_ROUNDS` times each.

There are no opt-in classes: a case of an optional capability reads ``broker.capabilities``.
Where the broker declares ``shared_limits`` the shared-limits cases hold it to the limits;
where it does not, the same cases hold it to refusing them (`ValueError`, nothing changed).
Quota cases (and `queue_state`'s quota figures) skip, naming ``shared_quota``, on a broker
that does not declare it.
"""

from __future__ import annotations

from taskgate.testing.contract._fixtures import BrokerFactory, ContractFixtures
from taskgate.testing.contract._support import RACE_ROUNDS
from taskgate.testing.contract.backpressure import BackPressureContract
from taskgate.testing.contract.cancel import CancelContract
from taskgate.testing.contract.claim_acks import ClaimAcksContract
from taskgate.testing.contract.claim_types import ClaimTypesContract
from taskgate.testing.contract.claims import ClaimContract, WaitContract
from taskgate.testing.contract.compensation import CompensationContract
from taskgate.testing.contract.dependencies import DependencyContract
from taskgate.testing.contract.groups import GroupContract
from taskgate.testing.contract.holds import HoldContract
from taskgate.testing.contract.large_batch import LargeBatchContract
from taskgate.testing.contract.leases import LeaseContract
from taskgate.testing.contract.lifecycle import LifecycleContract
from taskgate.testing.contract.priorities import PriorityContract
from taskgate.testing.contract.progress import ProgressContract
from taskgate.testing.contract.prune import PruneContract
from taskgate.testing.contract.queue_state import QueueStateContract
from taskgate.testing.contract.quota import QuotaContract
from taskgate.testing.contract.races import RaceContract
from taskgate.testing.contract.read import BusinessKeyContract, ReadContract
from taskgate.testing.contract.replay import ReplayContract, ReplayDescendantsContract
from taskgate.testing.contract.settle import QuietSettleContract, SettleContract
from taskgate.testing.contract.settled import SettledContract
from taskgate.testing.contract.shared_limits import SharedLimitsContract
from taskgate.testing.contract.steps import StepContract
from taskgate.testing.contract.submit import SubmitContract
from taskgate.testing.contract.surface import SurfaceContract
from taskgate.testing.contract.timeouts import TimeoutContract
from taskgate.testing.contract.trace_context import TraceContextContract
from taskgate.testing.contract.validation import ValidationContract

__all__ = ["RACE_ROUNDS", "BrokerContract", "BrokerFactory"]


class BrokerContract(
    ContractFixtures,
    SurfaceContract,
    LifecycleContract,
    SubmitContract,
    BackPressureContract,
    LargeBatchContract,
    ClaimContract,
    ClaimAcksContract,
    ClaimTypesContract,
    PriorityContract,
    WaitContract,
    DependencyContract,
    CancelContract,
    LeaseContract,
    ReadContract,
    BusinessKeyContract,
    ReplayContract,
    ReplayDescendantsContract,
    TimeoutContract,
    GroupContract,
    QuotaContract,
    QueueStateContract,
    HoldContract,
    PruneContract,
    ProgressContract,
    StepContract,
    TraceContextContract,
    SharedLimitsContract,
    ValidationContract,
    RaceContract,
    SettleContract,
    QuietSettleContract,
    SettledContract,
    CompensationContract,
):
    """Every broker contract test; subclass it as ``Test<Backend>`` and define ``broker_factory``."""
