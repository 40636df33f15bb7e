"""The mock gateway itself: every switch does what it says and the counters are exact."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

import taskgate

from .client import GatewayHTTPError, complete, stream
from .gateway import Gateway, Switches


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    with Gateway() as gw:
        yield gw


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=64) as executor:
        yield executor


def _held_calls(
    gw: Gateway, pool: ThreadPoolExecutor, n: int, call: Callable[[str], str]
) -> list[Future[str]]:
    """Start ``n`` calls that the gateway holds, and return once all ``n`` are held."""
    gw.configure(hold=True)
    futures = [pool.submit(call, f"held-{i}") for i in range(n)]
    gw.wait_until(lambda c: c.held == n)
    return futures


def test_a_plain_request_is_answered_and_counted(gateway: Gateway) -> None:
    assert complete(gateway.url, "t1", "hello world") == "HELLO WORLD"
    c = gateway.settled()
    assert (c.requests, c.ok, c.busy, c.failures, c.crashes, c.in_flight) == (1, 1, 0, 0, 0, 0)
    assert c.max_concurrency == 1
    assert c.tag("t1") == 1


def test_a_stream_joins_its_events(gateway: Gateway) -> None:
    assert stream(gateway.url, "s1", "one two three") == "ONE TWO THREE"
    assert gateway.settled().ok == 1


def test_latency_delays_every_answer(gateway: Gateway) -> None:
    gateway.configure(latency=0.3)
    started = time.monotonic()
    complete(gateway.url, "slow", "x")
    assert time.monotonic() - started >= 0.3


def test_busy_above_concurrency_answers_200_with_a_busy_body(
    gateway: Gateway, pool: ThreadPoolExecutor
) -> None:
    gateway.configure(busy_above=3)
    held = _held_calls(gateway, pool, 3, lambda tag: complete(gateway.url, tag, "x"))
    for i in range(5):
        with pytest.raises(taskgate.Throttled):
            complete(gateway.url, f"extra-{i}", "x")
    gateway.release()
    assert [f.result(timeout=10) for f in held] == ["X"] * 3
    c = gateway.settled()
    assert (c.requests, c.ok, c.busy, c.max_concurrency) == (8, 3, 5, 4)


def test_busy_above_concurrency_hides_in_an_sse_event(gateway: Gateway, pool: ThreadPoolExecutor) -> None:
    gateway.configure(busy_above=1)
    held = _held_calls(gateway, pool, 1, lambda tag: stream(gateway.url, tag, "a b"))
    with pytest.raises(taskgate.Throttled):
        stream(gateway.url, "second", "a b")
    gateway.release()
    assert held[0].result(timeout=10) == "A B"
    c = gateway.settled()
    assert (c.busy, c.ok) == (1, 1)


def test_busy_first_n_answers_busy_then_recovers(gateway: Gateway) -> None:
    gateway.configure(busy_first=2)
    for _ in range(2):
        with pytest.raises(taskgate.Throttled):
            complete(gateway.url, "t", "x")
    assert complete(gateway.url, "t", "x") == "X"
    c = gateway.settled()
    assert (c.requests, c.busy, c.ok, c.tag("t")) == (3, 2, 1, 3)


def test_busy_first_n_applies_to_streams_too(gateway: Gateway) -> None:
    gateway.configure(busy_first=1)
    with pytest.raises(taskgate.Throttled):
        stream(gateway.url, "t", "x y")
    assert stream(gateway.url, "t", "x y") == "X Y"


def test_fail_rate_follows_its_seed(gateway: Gateway) -> None:
    gateway.configure(fail_rate=0.3, seed=42)
    draws = random.Random(42)
    expected = [draws.random() < 0.3 for _ in range(40)]
    seen = []
    for i in range(40):
        try:
            complete(gateway.url, f"f{i}", "x")
            seen.append(False)
        except GatewayHTTPError as exc:
            assert exc.status == 500
            seen.append(True)
    assert seen == expected
    assert 0 < gateway.settled().failures == sum(expected) < 40


def test_crash_above_concurrency_drops_the_connection(gateway: Gateway, pool: ThreadPoolExecutor) -> None:
    gateway.configure(crash_above=2)
    held = _held_calls(gateway, pool, 2, lambda tag: complete(gateway.url, tag, "x"))
    for i in range(3):
        with pytest.raises(ConnectionError):
            complete(gateway.url, f"dropped-{i}", "x")
    gateway.release()
    assert [f.result(timeout=10) for f in held] == ["X", "X"]
    c = gateway.settled()
    assert (c.requests, c.ok, c.crashes, c.busy) == (5, 2, 3, 0)


def test_counters_are_exact_under_concurrent_requests(gateway: Gateway, pool: ThreadPoolExecutor) -> None:
    n = 48
    barrier = threading.Barrier(n)

    def call(i: int) -> str:
        barrier.wait()
        return complete(gateway.url, f"c{i % 6}", "x")

    gateway.configure(hold=True)
    futures = [pool.submit(call, i) for i in range(n)]
    seen = gateway.wait_until(lambda c: c.held == n)
    assert (seen.in_flight, seen.max_concurrency) == (n, n)
    gateway.release()
    assert all(f.result(timeout=10) == "X" for f in futures)
    c = gateway.settled()
    assert (c.requests, c.ok, c.max_concurrency) == (n, n, n)
    assert dict(c.by_tag) == {f"c{k}": n // 6 for k in range(6)}


def test_wait_until_times_out_with_the_counters(gateway: Gateway) -> None:
    with pytest.raises(TimeoutError, match="requests=0"):
        gateway.wait_until(lambda c: c.requests > 0, timeout=0.05)


def test_switches_are_validated_and_readable(gateway: Gateway) -> None:
    with pytest.raises(TypeError, match="nope"):
        gateway.configure(nope=1)
    gateway.configure(latency=0.01, busy_above=4)
    assert gateway.switches == Switches(latency=0.01, busy_above=4)


def test_close_wakes_held_requests(pool: ThreadPoolExecutor) -> None:
    gw = Gateway(Switches(hold=True)).start()
    future = pool.submit(complete, gw.url, "h", "x")
    gw.wait_until(lambda c: c.held == 1)
    gw.close()
    assert future.result(timeout=10) == "X"


def test_a_client_that_hangs_up_mid_request_does_not_disturb_the_gateway(gateway: Gateway) -> None:
    gateway.configure(hold=True)
    with socket.create_connection(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))) as sock:
        body = b'{"tag": "gone", "prompt": "x"}'
        head = f"POST /v1/complete HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        sock.sendall(head + body)
        gateway.wait_until(lambda c: c.held == 1)
    gateway.release()
    assert gateway.settled().tag("gone") == 1
    assert complete(gateway.url, "after", "still here") == "STILL HERE"
