"""The handler side of the end-to-end tests: a blocking HTTP client for the mock gateway.

It behaves as an application's gateway client should under taskgate: a "busy" answer -- in a
200 JSON body or hidden in an SSE event -- raises `taskgate.Throttled`, so the task is
re-queued without spending a retry; HTTP errors raise `GatewayHTTPError` and dropped
connections raise the stdlib's `ConnectionError`, both taking the ordinary retry path.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import taskgate

from .gateway import iter_sse

__all__ = ["RETRY_AFTER", "GatewayHTTPError", "complete", "stream"]

# Seconds a busy answer defers the task. Short, so scenarios finish in seconds.
RETRY_AFTER = 0.05


class GatewayHTTPError(Exception):
    """The gateway answered with an HTTP error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"gateway answered HTTP {status}: {body[:200]!r}")
        self.status = status


def _post(base_url: str, path: str, body: dict[str, Any], timeout: float) -> http.client.HTTPResponse:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status >= 400:
        data = response.read()
        conn.close()
        raise GatewayHTTPError(response.status, data)
    return response


def _raise_if_busy(message: Any) -> None:
    error = message.get("error") if isinstance(message, dict) else None
    if isinstance(error, dict) and error.get("type") == "busy":
        raise taskgate.Throttled(retry_after=RETRY_AFTER, message=str(error.get("message", "busy")))


def complete(base_url: str, tag: str, prompt: str, *, timeout: float = 30.0) -> str:
    """POST ``prompt`` to ``/v1/complete`` and return the output.

    Raises `taskgate.Throttled` on a busy body behind a 200.
    """
    with _post(base_url, "/v1/complete", {"tag": tag, "prompt": prompt}, timeout) as response:
        message = json.loads(response.read())
    _raise_if_busy(message)
    return str(message["output"])


def stream(base_url: str, tag: str, prompt: str, *, timeout: float = 30.0) -> str:
    """POST ``prompt`` to ``/v1/stream`` and join the streamed deltas.

    Raises `taskgate.Throttled` when an event carries a busy error, whatever the status said.
    """
    parts: list[str] = []
    with _post(base_url, "/v1/stream", {"tag": tag, "prompt": prompt}, timeout) as response:
        for data in iter_sse(iter(response.readline, b"")):
            if data == "[DONE]":
                break
            event = json.loads(data)
            _raise_if_busy(event)
            parts.append(event["delta"])
    return "".join(parts).strip()
