"""The contract's round-trip, claim, wake-up, dependency and read cases on a real 3-node Redis Cluster.

The test starts its own cluster (three ``redis-server --cluster-enabled yes`` on free loopback
ports, joined by ``redis-cli --cluster create``), so it never touches the shared Redis. Every
broker key carries one hash tag, so each Lua script's keys live in one slot; each test uses a
fresh prefix, whose slot differs from test to test, so the cases land on different nodes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from helpers.redis_servers import RedisClusterNodes, have_redis_server, purge_keys
from redis.cluster import RedisCluster

from taskgate.brokers.base import NewTask, QuotaSpec
from taskgate.brokers.params import Claim, SharedLimits, Submit
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.clock import ManualClock
from taskgate.ids import new_id
from taskgate.testing import steps
from taskgate.testing.contract import BrokerFactory
from taskgate.testing.contract._fixtures import ContractFixtures
from taskgate.testing.contract.claims import ClaimContract, WaitContract
from taskgate.testing.contract.dependencies import DependencyContract
from taskgate.testing.contract.lifecycle import LifecycleContract
from taskgate.testing.contract.read import ReadContract

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A private 3-node cluster for this module, stopped at the end."""
    if not have_redis_server():
        message = "redis-server/redis-cli not installed: cannot start a test cluster"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    nodes = RedisClusterNodes(Path(tmp_path_factory.mktemp("redis-cluster"))).start()
    yield nodes
    nodes.stop()


def _cluster_client(nodes: RedisClusterNodes) -> RedisCluster:
    host, port = nodes.startup
    return RedisCluster(host=host, port=port, socket_timeout=5)


class TestRedisClusterBroker(
    ContractFixtures, LifecycleContract, ClaimContract, WaitContract, DependencyContract, ReadContract
):
    """Round trip, claims, wake-ups, dependencies and reads (`list` intersects several sorted
    sets in one script) through ``RedisCluster`` clients."""

    @pytest.fixture
    def broker_factory(self, clock: ManualClock, cluster: RedisClusterNodes) -> Iterator[BrokerFactory]:
        prefix = f"c{secrets.token_hex(4)}:"
        opened: list[tuple[RedisBroker, RedisCluster]] = []

        def open_broker() -> RedisBroker:
            client = _cluster_client(cluster)
            broker = RedisBroker(client, key_prefix=prefix, clock=clock)
            opened.append((broker, client))
            return broker

        yield open_broker
        for broker, client in opened:
            broker.close()
            client.close()
        cleanup = _cluster_client(cluster)
        try:
            purge_keys(cleanup, KeySpace(prefix).pattern())
        finally:
            cleanup.close()


def test_a_cluster_client_s_calls_are_never_split(cluster: RedisClusterNodes) -> None:
    # A split call goes to one connection; a Cluster client picks the node by key slot.
    client = _cluster_client(cluster)
    keys = KeySpace(f"c{secrets.token_hex(4)}:")
    broker = RedisBroker(client, key_prefix=keys.prefix)
    try:
        for _ in range(2):  # the first would ask for a connection; none is ever made
            task = NewTask(id=new_id(), type="t", queue="q")
            submit = Submit((task,), snapshots=False)
            assert broker.split(broker.submit, submit) is None
            broker.submit(submit)
            (lease,) = steps.claim(broker, "q", 1, timedelta(seconds=30))
            assert lease.task.id == task.id
    finally:
        broker.close()
        purge_keys(client, keys.pattern())
        client.close()


def test_every_key_of_a_broker_lives_in_one_cluster_slot(cluster: RedisClusterNodes) -> None:
    client = _cluster_client(cluster)
    keys = KeySpace(f"c{secrets.token_hex(4)}:")
    broker = RedisBroker(client, key_prefix=keys.prefix)
    try:
        parent, _child = steps.enqueue(
            broker,
            [
                NewTask(id="p", type="t", queue="q", business_key="k"),
                NewTask(id="c", type="t", queue="q", depends_on=("p",)),
            ],
        )
        (lease,) = steps.claim(broker, "q", 1, timedelta(seconds=30))
        steps.ack(broker, parent.id, lease.token, b"done")
        # The child the ack made ready, under a quota, a shared slot and the shared rate.
        quota = QuotaSpec("budget", 10, timedelta(hours=1))
        limits = SharedLimits(workers=2, rps=5, burst=1)
        (child,) = broker.claim(Claim("q", 1, timedelta(seconds=30), quota=quota, shared=limits)).leases
        assert child.task.id == "c"
        stored = [k.decode() for k in client.scan_iter(match=keys.pattern())]
        assert len(stored) >= 10, stored
        assert all(k.startswith(keys.base) for k in stored)
        slots = {client.keyslot(k) for k in stored}  # type: ignore[no-untyped-call]
        assert slots == {client.keyslot(keys.base)}  # type: ignore[no-untyped-call]
    finally:
        broker.close()
        purge_keys(client, keys.pattern())
        client.close()
