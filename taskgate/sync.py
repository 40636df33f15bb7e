"""`SyncClient`: the Gate's client methods as plain functions, for code without an event loop.

Flask and Django views, cron jobs and scripts submit and read through it from any number of
threads. Each call runs on one event loop of the client's own, reached through anyio's
`BlockingPortal`, in a daemon thread started by the first call -- in the process making it, so
a client made at import time works in forked web workers too, and a client nobody closed does
not keep its process from exiting.
"""

from __future__ import annotations

import builtins
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from taskgate.brokers.base import UNSET, Unset
from taskgate.config import Config
from taskgate.durations import DurationLike
from taskgate.errors import ShutdownError
from taskgate.gate import DEFAULT_POLL_INTERVAL, Gate
from taskgate.task import Filter, QueueStats, Status, Task

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient:
    """`Gate`'s client methods -- submit, read, wait, cancel, replay, pause -- as plain functions.

    Safe to call from many threads at once, none of which needs an event loop; each call
    blocks its thread until the answer is in. The client runs no workers (it registers no
    handlers), like a web process's gate: workers run elsewhere on the same ``config``'s store.
    Its methods take the arguments of the `Gate` methods of the same names and raise the
    same errors. ``poll_interval`` paces `wait` for tasks finished by other processes. `close`
    (or leaving a ``with`` block) stops the client's event loop; the broker stays open, as
    with a `Gate` (``config.broker.close()`` closes it). ``backend``: anyio's, for that loop.
    """

    def __init__(
        self, config: Config, *, poll_interval: float = DEFAULT_POLL_INTERVAL, backend: str = "asyncio"
    ) -> None:
        self._gate = Gate(config, poll_interval=poll_interval)
        self._backend = backend
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False

    # -- the event loop ---------------------------------------------------------------------------

    def _loop(self) -> BlockingPortal:
        with self._lock:
            if self._closed:
                raise ShutdownError("this SyncClient is closed")
            if self._portal is None or self._pid != os.getpid():
                # First call here (or in a forked child, where the parent's loop thread is gone).
                self._portal, self._thread = _start_loop(self._backend)
                self._pid = os.getpid()
            return self._portal

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        portal = self._loop()
        return portal.call(lambda: fn(*args, **kwargs))

    def close(self) -> None:
        """Stop the client's event loop; later calls raise `ShutdownError`. Idempotent."""
        with self._lock:
            self._closed = True
            portal, thread, self._portal, self._thread = self._portal, self._thread, None, None
            if portal is not None and thread is not None and self._pid == os.getpid():
                portal.call(portal.stop)
                thread.join()

    def __enter__(self) -> SyncClient:
        """The client itself; the block's end closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """`close` the client."""
        self.close()

    # -- submitting -------------------------------------------------------------------------------

    def submit(self, type: str, payload: Any = None, **options: Any) -> str:
        """`Gate.submit`: queue one task and return its execution id (options as there).

        On a full queue with ``on_full="block"`` it blocks the calling thread until there is
        room, with no deadline (a thread has no cancel scope): a caller that must not wait
        configures ``on_full="raise"`` and handles `QueueFullError`."""
        return self._call(self._gate.submit, type, payload, **options)

    def submit_many(self, type: str, payloads: Iterable[Any], **options: Any) -> builtins.list[str]:
        """`Gate.submit_many`: queue one task per payload, all or nothing; their ids in order."""
        return self._call(self._gate.submit_many, type, payloads, **options)

    def enqueue_in(self, session_or_connection: Any, type: str, payload: Any = None, **options: Any) -> str:
        """`Gate.enqueue_in`: write one task in the application's own SQLAlchemy transaction.

        Runs in the calling thread, on the caller's session or connection (no event loop)."""
        return self._gate.enqueue_in(session_or_connection, type, payload, **options)

    # -- reading ----------------------------------------------------------------------------------

    def get(self, id: str) -> Task:
        """`Gate.get`: the current snapshot of execution ``id``."""
        return self._call(self._gate.get, id)

    def list(self, filter: Filter | None = None, **filter_fields: Any) -> builtins.list[Task]:
        """`Gate.list`: tasks matching ``filter`` (or its fields as keywords)."""
        return self._call(self._gate.list, filter, **filter_fields)

    def history(self, business_key: str) -> builtins.list[Task]:
        """`Gate.history`: every execution of ``business_key``, oldest first."""
        return self._call(self._gate.history, business_key)

    def stats(self, queue: str) -> QueueStats:
        """`Gate.stats`: ``queue``'s limits, backlog and quota window, as the store holds them."""
        return self._call(self._gate.stats, queue)

    def overview(self) -> dict[str, dict[Status, int]]:
        """`Gate.overview`: task counts by type and status."""
        return self._call(self._gate.overview)

    def wait(self, id: str, *, timeout: float | None = None) -> bytes | None:
        """`Gate.wait`: the result of ``id`` once completed (`TaskFailedError`, `TimeoutError`)."""
        return self._call(self._gate.wait, id, timeout=timeout)

    def wait_json(self, id: str, *, timeout: float | None = None) -> Any:
        """`Gate.wait_json`: `wait`, with the result decoded from JSON."""
        return self._call(self._gate.wait_json, id, timeout=timeout)

    # -- changing ---------------------------------------------------------------------------------

    def cancel(self, id: str) -> Task:
        """`Gate.cancel`: cancel ``id`` (and its descendants); its snapshot."""
        return self._call(self._gate.cancel, id)

    def cancel_many(self, filter: Filter | None = None, **filter_fields: Any) -> int:
        """`Gate.cancel_many`: cancel every task the filter matches that is not final; how many."""
        return self._call(self._gate.cancel_many, filter, **filter_fields)

    def replay(
        self,
        execution_id: str,
        *,
        allow_completed: bool = False,
        payload: Any | Unset = UNSET,
        descendants: bool = False,
    ) -> str:
        """`Gate.replay`: re-run a final execution as a new one (with ``descendants``, with the
        stages its failure canceled); the new id."""
        return self._call(
            self._gate.replay,
            execution_id,
            allow_completed=allow_completed,
            payload=payload,
            descendants=descendants,
        )

    def replay_many(
        self, filter: Filter | None = None, *, allow_completed: bool = False, **filter_fields: Any
    ) -> builtins.list[str]:
        """`Gate.replay_many`: replay every final task the filter matches, with its canceled
        descendants; the new executions' ids."""
        return self._call(self._gate.replay_many, filter, allow_completed=allow_completed, **filter_fields)

    def purge(self, filter: Filter | None = None, *, older_than: DurationLike | None = None) -> int:
        """`Gate.purge`: delete the final tasks the filter matches; how many went."""
        return self._call(self._gate.purge, filter, older_than=older_than)

    def replay_by_key(
        self, business_key: str, *, allow_completed: bool = False, payload: Any | Unset = UNSET
    ) -> str:
        """`Gate.replay_by_key`: `replay` the newest execution of ``business_key``."""
        return self._call(
            self._gate.replay_by_key, business_key, allow_completed=allow_completed, payload=payload
        )

    def pause(self, queue: str, for_: DurationLike | None = None) -> datetime:
        """`Gate.pause`: hold ``queue`` in every process; when the hold ends."""
        return self._call(self._gate.pause, queue, for_)

    def resume(self, queue: str) -> None:
        """`Gate.resume`: end ``queue``'s hold."""
        self._call(self._gate.resume, queue)


def _start_loop(backend: str) -> tuple[BlockingPortal, threading.Thread]:
    """An event loop of ``backend`` in a new daemon thread, and the portal into it."""
    handed: queue.Queue[BlockingPortal | BaseException] = queue.Queue(maxsize=1)

    async def serve() -> None:
        async with BlockingPortal() as portal:
            handed.put(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve, backend=backend)
        except BaseException as exc:  # an unknown backend, a missing trio: the caller raises it
            handed.put(exc)

    thread = threading.Thread(target=run, name="taskgate-sync", daemon=True)
    thread.start()
    portal = handed.get()
    if isinstance(portal, BaseException):
        raise portal
    return portal, thread
