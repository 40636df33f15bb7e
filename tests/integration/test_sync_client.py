"""`SyncClient`: the Gate's client methods from plain threads with no event loop, on every backend."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from anyio.from_thread import start_blocking_portal
from gate_helpers import GUARD, POLL

from taskgate import (
    Config,
    ConfigError,
    Filter,
    Gate,
    QueueConfig,
    QueueStats,
    ShutdownError,
    Status,
    SyncClient,
    Task,
    TaskFailedError,
)
from taskgate.brokers.base import Broker

THREADS = 8


def _config(broker: Broker) -> Config:
    queues = {"q": QueueConfig(workers=4), "parked": QueueConfig(workers=1)}
    return Config(broker=broker, queues=queues, routes={"echo": "q", "boom": "q", "later": "parked"})


def _no_event_loop() -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


def _every_method(client: SyncClient, n: int) -> None:
    """One thread's round of every method, on tasks of its own."""
    _no_event_loop()
    key = f"order-{n}-{threading.get_ident()}"
    first = client.submit("echo", {"n": n}, business_key=key)
    batch = client.submit_many("echo", [n, n + 1])
    assert client.wait_json(first, timeout=GUARD) == {"n": n}
    assert client.wait(batch[1], timeout=GUARD) == str(n + 1).encode()
    assert client.get(first).status is Status.COMPLETED
    assert {t.id for t in client.list(Filter(type="echo"), limit=0)} >= {first, *batch}
    assert [t.id for t in client.history(key)] == [first]
    again = client.replay_by_key(key, allow_completed=True)
    assert client.wait_json(again, timeout=GUARD) == {"n": n}
    third = client.replay(again, allow_completed=True, payload={"n": -n})
    assert client.wait_json(third, timeout=GUARD) == {"n": -n}
    failing = client.submit("boom")
    with pytest.raises(TaskFailedError):
        client.wait(failing, timeout=GUARD)
    parked = client.submit("later", delay="1h")
    assert client.cancel(parked).status is Status.CANCELED
    tenant = f"tenant-{n}-{threading.get_ident()}"
    client.submit_many("later", [1, 2], group=tenant, delay="1h")
    assert client.cancel_many(group=tenant) == 2
    (rerun,) = client.replay_many(Filter(group=tenant, limit=1))
    assert client.get(rerun).group == tenant
    failing_again = client.replay(failing, descendants=True)
    with pytest.raises(TaskFailedError):
        client.wait(failing_again, timeout=GUARD)
    assert client.purge(Filter(type="later", status=Status.CANCELED, limit=1)) == 1
    assert isinstance(client.stats("q"), QueueStats)
    assert client.overview()["echo"][Status.COMPLETED] >= 4
    assert client.pause("parked", for_="1h") > client.get(first).created_at
    client.resume("parked")  # (another thread may pause it again: the threads share the queue)


def _worker(config: Config) -> Gate:
    gate = Gate(config, poll_interval=POLL)

    @gate.handler("echo")
    def echo(task: Task) -> object:
        return task.json()

    @gate.handler("boom")
    def boom(task: Task) -> None:
        raise ValueError("no")

    return gate


def test_eight_threads_with_no_event_loop_call_every_method_at_once(broker: Broker) -> None:
    config = _config(broker)
    # The workers run on an event loop of their own, as in a separate worker process.
    with (
        SyncClient(config, poll_interval=POLL) as client,
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_worker(config)),
        ThreadPoolExecutor(THREADS) as pool,
    ):
        for done in [pool.submit(_every_method, client, n) for n in range(THREADS)]:
            done.result(timeout=GUARD * 4)
    counts = {status: n for by_status in [client_overview(broker)] for status, n in by_status.items()}
    assert counts[Status.COMPLETED] == THREADS * 5 and counts[Status.FAILED] == THREADS * 2


def client_overview(broker: Broker) -> dict[Status, int]:
    """Task counts by status across types, read through a fresh client."""
    with SyncClient(_config(broker)) as reader:
        totals: dict[Status, int] = {}
        for by_status in reader.overview().values():
            for status, n in by_status.items():
                totals[status] = totals.get(status, 0) + n
        return totals


def test_a_closed_client_refuses_calls_and_closing_twice_is_fine(gate_broker: Broker) -> None:
    client = SyncClient(_config(gate_broker))
    assert client.submit("echo", 1)
    client.close()
    client.close()
    with pytest.raises(ShutdownError, match="this SyncClient is closed"):
        client.submit("echo", 2)


def test_errors_reach_the_caller_as_the_gate_raises_them(gate_broker: Broker) -> None:
    with SyncClient(_config(gate_broker)) as client:
        with pytest.raises(ConfigError, match="unknown queue 'nope'"):
            client.stats("nope")
        with pytest.raises(TimeoutError):
            client.wait(client.submit("later", delay="1h"), timeout=0.05)


def test_a_client_needs_a_config() -> None:
    with pytest.raises(ConfigError, match=r"Gate needs a taskgate\.Config, got str"):
        SyncClient("sqlite:///x.db")  # type: ignore[arg-type]
