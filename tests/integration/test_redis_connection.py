"""RedisBroker when its server dies, stalls and comes back (a private redis-server per test).

The shared Redis is never touched. Every broker call during an outage raises `BrokerError`
(chained to the redis-py error) within ``socket_timeout``; once the server is back the same
broker object works again: the pool reconnects (the AOF kept the function library).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
import redis
from helpers.redis_servers import RedisServer, have_redis_server
from redis.backoff import NoBackoff
from redis.retry import Retry

from taskgate.brokers.base import NewTask, QuotaSpec
from taskgate.brokers.params import (
    Claim,
    Heartbeat,
    QueueQuery,
    Requeue,
    Settle,
    SharedLimits,
    Submit,
    Submitted,
)
from taskgate.brokers.redis import RedisBroker
from taskgate.brokers.redis.keys import KeySpace
from taskgate.brokers.redis.split import LOOP_CLIENT_NAME
from taskgate.errors import BrokerError
from taskgate.runtime.calls import BrokerCalls
from taskgate.task import Filter, Status
from taskgate.testing import steps

pytestmark = pytest.mark.slow

SOCKET_TIMEOUT = 0.5
# Slack for process scheduling on a busy CI machine, on top of the socket timeout.
SLACK = 1.0
TTL = timedelta(seconds=30)
QUOTA = QuotaSpec("budget", 10, timedelta(hours=1))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server that persists every write (AOF, fsync always)."""
    if not have_redis_server():
        message = "redis-server not installed: cannot start a private server"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    private = RedisServer(tmp_path / "redis", appendonly=True).start()
    yield private
    if private.process is not None and private.process.poll() is None:
        os.kill(private.process.pid, signal.SIGCONT)
    private.stop()


@pytest.fixture
def broker(server: RedisServer) -> Iterator[RedisBroker]:
    opened = RedisBroker(server.url, socket_timeout=SOCKET_TIMEOUT)
    yield opened
    opened.close()


def _outage_calls(broker: RedisBroker) -> dict[str, Callable[[], object]]:
    return {
        "get": lambda: broker.get("before"),
        "enqueue": lambda: steps.enqueue(broker, [NewTask(id="during", type="t", queue="q")]),
        "claim": lambda: steps.claim(broker, "q", 1, TTL),
        "list": lambda: broker.list(Filter()),
        "counts": broker.counts,
        "queue_state": lambda: broker.queue_state(QueueQuery("q", QUOTA)),
        "reap": lambda: broker.reap(lease_lost_max=3),
        "claim_quota": lambda: broker.claim(Claim("q", 1, TTL, quota=QUOTA)),
        "claim_shared": lambda: broker.claim(Claim("q", 1, TTL, shared=SharedLimits(workers=2, rps=5))),
        "settle": lambda: broker.settle(Settle((Requeue("before", "token"),))),
        "heartbeat": lambda: broker.heartbeat(Heartbeat("before", "token", TTL, slot_queue="q")),
        "wait_for_work": lambda: broker.wait_for_work(["q"], 5.0),
    }


def _assert_every_call_fails_fast(broker: RedisBroker) -> None:
    for name, call in _outage_calls(broker).items():
        started = time.monotonic()
        with pytest.raises(BrokerError) as info:
            call()
        assert time.monotonic() - started < SOCKET_TIMEOUT + SLACK, name
        assert isinstance(info.value.__cause__, redis.RedisError), name


def test_a_dead_server_raises_broker_error_and_a_restarted_one_serves_again(
    server: RedisServer, broker: RedisBroker
) -> None:
    (before,) = steps.enqueue(broker, [NewTask(id="before", type="t", queue="q")])
    server.kill()

    _assert_every_call_fails_fast(broker)

    server.start()  # same port and directory: the AOF brings the task back
    assert broker.get("before") == before
    (lease,) = steps.claim(broker, "q", 1, TTL)
    assert steps.ack(broker, lease.task.id, lease.token, b"ok").status is Status.COMPLETED


def test_a_stalled_server_times_out_within_the_socket_timeout(
    server: RedisServer, broker: RedisBroker
) -> None:
    steps.enqueue(broker, [NewTask(id="before", type="t", queue="q")])
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        for name in ("get", "claim", "claim_quota"):
            started = time.monotonic()
            with pytest.raises(BrokerError):
                _outage_calls(broker)[name]()
            assert time.monotonic() - started < SOCKET_TIMEOUT + SLACK, name
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert steps.claim(broker, "q", 1, TTL)[0].task.id == "before"


def _await_subscriber(server: RedisServer, channel: str) -> None:
    """Return once ``channel`` has a subscriber (the waiter is blocked in its read)."""
    probe = redis.Redis.from_url(server.url)
    deadline = time.monotonic() + 10
    try:
        while probe.pubsub_numsub(channel)[0][1] == 0:
            assert time.monotonic() < deadline, "the waiter never subscribed"
            time.sleep(0.01)
    finally:
        probe.close()


def test_a_waiter_gets_broker_error_when_the_server_dies(server: RedisServer, broker: RedisBroker) -> None:
    outcome: list[BaseException | bool] = []

    def wait() -> None:
        try:
            outcome.append(broker.wait_for_work(["q"], 30.0))
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    _await_subscriber(server, KeySpace(broker.key_prefix).signal("q"))
    server.kill()
    waiter.join(SOCKET_TIMEOUT + SLACK + 1.0)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], BrokerError)


def test_a_full_server_still_answers_the_reading_scripts(server: RedisServer, broker: RedisBroker) -> None:
    steps.enqueue(broker, [NewTask(id="a", type="t", queue="q", business_key="k")])
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # used memory is above it now: Redis refuses writes
    try:
        # Reading scripts are registered 'no-writes', so Redis runs them as it ran such EVALs.
        assert [t.id for t in broker.list(Filter())] == ["a"]
        assert [t.id for t in steps.history(broker, "k")] == ["a"]
        with pytest.raises(BrokerError, match="maxmemory"):
            steps.enqueue(broker, [NewTask(id="b", type="t", queue="q")])
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    assert [t.id for t in broker.list(Filter())] == ["a"]


def _subscribers(client: redis.Redis, channel: str) -> int:
    return int(client.pubsub_numsub(channel)[0][1])


def test_waits_reuse_one_subscribed_connection_and_follow_a_change_of_queues(
    server: RedisServer, broker: RedisBroker
) -> None:
    # A private server: it counts every connection made to it, and only this test makes any.
    client = redis.Redis.from_url(server.url)
    keys = KeySpace(broker.key_prefix)
    assert broker.wait_for_work(["q"], 0.01) is False
    connected = int(client.info("stats")["total_connections_received"])
    for _ in range(5):
        assert broker.wait_for_work(["q"], 0.01) is False
    assert int(client.info("stats")["total_connections_received"]) == connected
    assert _subscribers(client, keys.signal("q")) == 1  # still subscribed between waits
    steps.enqueue(broker, [NewTask(id="other-work", type="t", queue="other")])
    assert broker.wait_for_work(["other"], 0.01) is True  # the due check of the new queue
    assert (_subscribers(client, keys.signal("q")), _subscribers(client, keys.signal("other"))) == (0, 1)
    broker.close()
    # The server drops the subscription when it processes the closed connection, which another
    # client's PUBSUB NUMSUB may ask about first: wait for it, with a guard.
    gone_by = time.monotonic() + 5.0
    while _subscribers(client, keys.signal("other")) != 0:
        assert time.monotonic() < gone_by, "the closed broker's subscription never went away"
        time.sleep(0.005)
    client.close()


def test_zero_timeout_waits_answer_due_work_without_opening_a_connection_each(
    server: RedisServer, broker: RedisBroker
) -> None:
    # The runtime asks `wait_for_work(queue, 0)` before each claim of an idle metered queue,
    # several times a second: each must be a due check on the pooled connection, no Pub/Sub.
    client = redis.Redis.from_url(server.url)
    keys = KeySpace(broker.key_prefix)
    try:
        assert broker.wait_for_work(["q"], 0) is False  # the pool's connection opens here
        connected = int(client.info("stats")["total_connections_received"])
        for _ in range(20):
            assert broker.wait_for_work(["q"], 0) is False
        assert int(client.info("stats")["total_connections_received"]) == connected
        steps.enqueue(broker, [NewTask(id="due", type="t", queue="q")])
        for _ in range(20):
            assert broker.wait_for_work(["q"], 0) is True
        assert int(client.info("stats")["total_connections_received"]) == connected
        assert _subscribers(client, keys.signal("q")) == 0
    finally:
        client.close()


def test_waits_too_short_for_the_subscription_to_be_confirmed_keep_their_connection(
    server: RedisServer, broker: RedisBroker
) -> None:
    # A wait whose deadline passes before the server confirmed its SUBSCRIBE still answers the
    # due check, and keeps the connection for the next wait instead of opening one each time.
    client = redis.Redis.from_url(server.url)
    try:
        assert broker.wait_for_work(["q"], 0) is False  # the pool's connection opens here
        connected = int(client.info("stats")["total_connections_received"])
        for _ in range(20):
            assert broker.wait_for_work(["q"], 1e-9) is False
        # One Pub/Sub connection for them all.
        assert int(client.info("stats")["total_connections_received"]) <= connected + 1
        steps.enqueue(broker, [NewTask(id="due", type="t", queue="q")])
        assert broker.wait_for_work(["q"], 1e-9) is True
    finally:
        client.close()


def _quiet_submit(task_id: str) -> Submit:
    return Submit((NewTask(id=task_id, type="t", queue="q"),), snapshots=False)


def _split_calls(broker: RedisBroker) -> BrokerCalls:
    """The runtime's broker door with the broker's split calls, one event-loop connection open."""
    assert broker.split(broker.counts) is None  # not split: nothing asked
    assert broker.split(broker.claim, Claim("warm-up", 1, TTL)) is None  # asks for a connection
    steps.claim(broker, "warm-up", 1, TTL)  # a thread's script run opens it
    return BrokerCalls(2, split=broker.split)


@pytest.mark.parametrize("outage", ["dead", "stalled"])
def test_split_calls_fail_within_the_socket_timeout_and_serve_again_after(
    server: RedisServer, broker: RedisBroker, outage: str
) -> None:
    steps.enqueue(broker, [NewTask(id="before", type="t", queue="q")])
    calls = _split_calls(broker)
    assert server.process is not None

    async def fails_fast() -> None:
        for _ in range(3):  # the split call, then the thread path it falls back to
            started = time.monotonic()
            with pytest.raises(BrokerError):
                await calls(broker.submit, _quiet_submit("during"))
            assert time.monotonic() - started < SOCKET_TIMEOUT + SLACK

    if outage == "dead":
        server.kill()
        anyio.run(fails_fast)
        server.start()
    else:
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            anyio.run(fails_fast)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)

    async def serves_again() -> list[Status]:
        await calls(broker.counts)  # a thread call reconnects the pool
        submitted: Submitted = await calls(broker.submit, _quiet_submit("after"))
        return submitted.statuses

    assert anyio.run(serves_again) == [Status.PENDING]
    assert broker.get("after").status is Status.PENDING


class _CountingConnection(redis.Connection):
    """A redis-py connection that counts the connects of the broker's event-loop connections."""

    loop_connects = 0

    def connect(self) -> None:
        if self.client_name == LOOP_CLIENT_NAME:
            type(self).loop_connects += 1
        super().connect()


def test_a_call_that_failed_opens_no_event_loop_connection(server: RedisServer) -> None:
    # Opened before the call instead, it would make a stalled server cost two socket timeouts.
    pool = redis.ConnectionPool.from_url(
        server.url,
        connection_class=_CountingConnection,
        socket_timeout=SOCKET_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    client = redis.Redis(connection_pool=pool)
    broker = RedisBroker(client, socket_timeout=SOCKET_TIMEOUT)
    _CountingConnection.loop_connects = 0
    try:
        steps.enqueue(broker, [NewTask(id="before", type="t", queue="q")])
        assert broker.split(broker.claim, Claim("q", 1, TTL)) is None  # asks for a loop connection
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(BrokerError):
                steps.claim(broker, "q", 1, TTL)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert _CountingConnection.loop_connects == 0
        broker.counts()  # a plain command: the pool reconnects, no script ran
        # A script answered: now it opens.
        assert broker.submit(_quiet_submit("after")).statuses == [Status.PENDING]
        assert _CountingConnection.loop_connects == 1
    finally:
        broker.close()
        client.close()
