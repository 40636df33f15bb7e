"""A misbehaving LLM/OCR gateway on loopback, for the end-to-end tests (a test component, not library API).

Real gateways fail in ways a queue must absorb, and these switches reproduce them:

- ``latency``: seconds every non-busy answer takes;
- ``busy_above``: with more requests in flight than this, answer **HTTP 200** whose JSON body
  (or first SSE event) carries ``{"error": {"type": "busy"}}`` -- the status code lies;
- ``busy_first``: the next N requests answer busy whatever the load;
- ``fail_rate`` + ``seed``: that fraction of requests get HTTP 500, drawn from a seeded
  generator so a run is reproducible;
- ``crash_above``: with more requests in flight than this, drop the connection (TCP reset)
  without an answer;
- ``hold``: requests that would succeed wait until `Gateway.release` (lets a test catch a
  handler mid-call without guessing a duration).

Endpoints: ``POST /v1/complete`` (JSON in, JSON out) and ``POST /v1/stream`` (Server-Sent
Events). The request body is JSON ``{"tag": str, "prompt": str}``; the tag lets a test count
requests per task. `Gateway.counters` returns every counter from one lock hold, and
`Gateway.wait_until` blocks until a predicate on them holds, so tests never sleep.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

__all__ = ["BUSY_ERROR", "Counters", "Gateway", "Switches"]

BUSY_ERROR = {"error": {"type": "busy", "message": "the model is overloaded, try again later"}}
INTERNAL_ERROR = {"error": {"type": "internal", "message": "upstream exploded"}}

OK, BUSY, FAIL, CRASH = "ok", "busy", "fail", "crash"


@dataclass(frozen=True, slots=True)
class Switches:
    """How the gateway misbehaves; ``None``/0 turns a switch off."""

    latency: float = 0.0
    busy_above: int | None = None
    busy_first: int = 0
    fail_rate: float = 0.0
    seed: int = 0
    crash_above: int | None = None
    hold: bool = False


@dataclass(frozen=True, slots=True)
class Counters:
    """One consistent reading of the gateway's counters.

    ``requests`` counts every request received, ``in_flight`` those not yet answered and
    ``max_concurrency`` the most ever in flight at once (busy and dropped ones included).
    ``held`` counts requests that waited for `Gateway.release`, ``gone`` answers whose client
    had already disconnected. ``by_tag`` counts requests per body tag;
    ``ok + busy + failures + crashes == requests`` once nothing is in flight.
    """

    requests: int = 0
    in_flight: int = 0
    max_concurrency: int = 0
    ok: int = 0
    busy: int = 0
    failures: int = 0
    crashes: int = 0
    held: int = 0
    gone: int = 0
    by_tag: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def tag(self, tag: str) -> int:
        """How many requests carried ``tag``."""
        return self.by_tag.get(tag, 0)


class _State:
    """Switches and counters behind one condition variable (the atomic part of the gateway)."""

    def __init__(self, switches: Switches) -> None:
        self.cond = threading.Condition()
        self.switches = switches
        self.busy_first_left = switches.busy_first
        self.rng = random.Random(switches.seed)
        self.counts: Counter[str] = Counter()
        self.by_tag: Counter[str] = Counter()
        self.in_flight = 0
        self.max_concurrency = 0
        self.released = threading.Event()
        self.closing = threading.Event()

    def arrive(self, tag: str) -> str:
        """Count a request and decide, in the same lock hold, how it will be answered."""
        with self.cond:
            self.counts["requests"] += 1
            self.by_tag[tag] += 1
            self.in_flight += 1
            self.max_concurrency = max(self.max_concurrency, self.in_flight)
            outcome = self._decide()
            self.counts[outcome] += 1
            self.cond.notify_all()
            return outcome

    def _decide(self) -> str:
        sw = self.switches
        if sw.crash_above is not None and self.in_flight > sw.crash_above:
            return CRASH
        if self.busy_first_left > 0:
            self.busy_first_left -= 1
            return BUSY
        if sw.busy_above is not None and self.in_flight > sw.busy_above:
            return BUSY
        # Draw for every remaining request, so the sequence of draws depends on the seed only.
        if self.rng.random() < sw.fail_rate:
            return FAIL
        return OK

    def leave(self) -> None:
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def note(self, name: str, delta: int) -> None:
        with self.cond:
            self.counts[name] += delta
            self.cond.notify_all()

    def snapshot(self) -> Counters:
        with self.cond:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> Counters:
        c = self.counts
        return Counters(
            requests=c["requests"],
            in_flight=self.in_flight,
            max_concurrency=self.max_concurrency,
            ok=c[OK],
            busy=c[BUSY],
            failures=c[FAIL],
            crashes=c[CRASH],
            held=c["held"],
            gone=c["gone"],
            by_tag=MappingProxyType(dict(self.by_tag)),
        )

    def wait_until(self, predicate: Callable[[Counters], bool], timeout: float) -> Counters:
        with self.cond:
            if not self.cond.wait_for(lambda: predicate(self._snapshot_locked()), timeout):
                raise TimeoutError(f"gateway condition not met within {timeout}s: {self._snapshot_locked()}")
            return self._snapshot_locked()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, but wake at once when the gateway closes."""
        if seconds > 0:
            self.closing.wait(seconds)


def _sse_event(data: object) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    """Answers one request as the gateway's switches say."""

    state: _State  # set on the per-gateway subclass
    _in_flight = False  # this request counts in the gateway's in_flight
    server_version = "MockGateway/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: pytest captures stderr and the tests read counters instead."""

    def do_POST(self) -> None:
        """Route to the JSON or the SSE endpoint."""
        if self.path not in ("/v1/complete", "/v1/stream"):
            self._send_json(404, {"error": {"type": "not_found", "message": self.path}})
            return
        body = self._read_json()
        outcome = self.state.arrive(str(body.get("tag", "")))
        self._in_flight = True
        try:
            self._answer(outcome, body)
        except OSError:
            # The client went away first (e.g. its process was killed mid-request): count it,
            # and keep the traceback out of the test output.
            self.state.note("gone", 1)
            self.close_connection = True
        finally:
            self._leave()

    def _leave(self) -> None:
        """The request stops counting as in flight (once). Called before the answer's last
        bytes go out: a client that has its whole answer may send its next request at once,
        and that one must not find this one still counted."""
        if self._in_flight:
            self._in_flight = False
            self.state.leave()

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            data = json.loads(raw)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _answer(self, outcome: str, body: dict[str, Any]) -> None:
        if outcome == CRASH:
            self._drop()
            return
        if outcome == BUSY:
            self._send_busy()
            return
        self._work()
        if outcome == FAIL:
            self._send_json(500, INTERNAL_ERROR)
        elif self.path == "/v1/stream":
            self._send_stream(str(body.get("prompt", "")))
        else:
            self._send_json(200, {"tag": body.get("tag"), "output": str(body.get("prompt", "")).upper()})

    def _work(self) -> None:
        state = self.state
        if state.switches.hold and not state.released.is_set():
            state.note("held", 1)
            state.released.wait()  # set by release() and by close()
        state.pause(state.switches.latency)

    def _drop(self) -> None:
        # SO_LINGER with a zero timeout makes close() send a TCP reset: the client sees the
        # connection die without any answer, as when a gateway process crashes.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self._leave()
        self.connection.close()

    def _send_busy(self) -> None:
        if self.path == "/v1/stream":
            self._start_stream()
            self._leave()
            self.wfile.write(b": keep-alive\n\n" + _sse_event(BUSY_ERROR))
        else:
            self._send_json(200, BUSY_ERROR)

    def _send_stream(self, prompt: str) -> None:
        self._start_stream()
        for word in prompt.split():
            self.wfile.write(_sse_event({"delta": word.upper() + " "}))
        self._leave()
        self.wfile.write(_sse_event("[DONE]"))

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _send_json(self, status: int, data: object) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self._leave()
        self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Tests open dozens of connections at once; the default backlog of 5 would make the
    # kernel drop SYNs and the clients retry a second later.
    request_queue_size = 128
    # Do not join request threads on close: a held or slow request must not stall teardown.
    block_on_close = False


class Gateway:
    """The mock gateway: a `ThreadingHTTPServer` on 127.0.0.1 with an ephemeral port.

    Use as a context manager (``with Gateway(Switches(latency=0.05)) as gw: gw.url``).
    """

    def __init__(self, switches: Switches | None = None) -> None:
        self._state = _State(switches or Switches())
        handler = type("GatewayHandler", (_Handler,), {"state": self._state})
        self._server = _Server(("127.0.0.1", 0), handler)
        # A short poll interval keeps close() quick (serve_forever checks for shutdown between polls).
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="mock-gateway", daemon=True
        )

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def switches(self) -> Switches:
        """The switches in force."""
        with self._state.cond:
            return self._state.switches

    def configure(self, **changes: Any) -> None:
        """Change switches while running; ``busy_first``/``seed`` restart their sequences."""
        known = {f.name for f in fields(Switches)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown gateway switch(es): {unknown}")
        state = self._state
        with state.cond:
            state.switches = replace(state.switches, **changes)
            if "busy_first" in changes:
                state.busy_first_left = state.switches.busy_first
            if "seed" in changes:
                state.rng = random.Random(state.switches.seed)
            if changes.get("hold"):
                state.released.clear()

    def release(self) -> None:
        """Let every held request (and any later one) go on; turns ``hold`` off."""
        state = self._state
        with state.cond:
            state.switches = replace(state.switches, hold=False)
            state.released.set()

    def counters(self) -> Counters:
        """Every counter, read in one lock hold."""
        return self._state.snapshot()

    def wait_until(self, predicate: Callable[[Counters], bool], timeout: float = 10.0) -> Counters:
        """Block until ``predicate(counters)`` holds and return those counters.

        Raises `TimeoutError` (with the counters) when ``timeout`` seconds pass first.
        """
        return self._state.wait_until(predicate, timeout)

    def settled(self, timeout: float = 10.0) -> Counters:
        """The counters once no request is in flight.

        A client has its answer a moment before the server thread counts the request as done,
        so exact assertions read the counters through this.
        """
        return self.wait_until(lambda c: c.in_flight == 0, timeout)

    def start(self) -> Gateway:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, wake held and slow requests, release the port."""
        self._state.closing.set()
        self._state.released.set()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_sse(lines: Iterator[bytes]) -> Iterator[str]:
    """Yield the ``data`` of each Server-Sent Event read from ``lines`` (comments skipped)."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        yield "\n".join(data)
