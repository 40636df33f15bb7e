"""Wake-ups: a per-broker signal board, fed locally and (PostgreSQL) by LISTEN/NOTIFY.

Transitions in this process bump the board after they commit. On PostgreSQL they also
``pg_notify`` a channel named after the table prefix; a `Listener` thread holding one
dedicated connection turns those notifications from every process into bumps. If the
listener cannot connect, waiters simply fall back to polling (see `SQLBroker.wait_for_work`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Engine

__all__ = ["Listener", "Signals"]

log = logging.getLogger("taskgate.brokers.sql")

# How long the listener blocks per read: bounds how long `close` waits for it.
_LISTEN_SLICE = 0.2
# Pause before reconnecting a listener whose connection failed.
_RECONNECT_PAUSE = 1.0


class Signals:
    """Counters per queue, bumped when a queue may have work; waiters wait for a change."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._counts: defaultdict[str, int] = defaultdict(int)
        self.closed = False

    def seen(self, queues: Sequence[str]) -> list[int]:
        """The current counters of ``queues``, to compare against later."""
        with self._cond:
            return [self._counts[q] for q in queues]

    def bump(self, queues: Iterable[str]) -> None:
        """Announce that ``queues`` may have work, waking their waiters."""
        with self._cond:
            for queue in queues:
                self._counts[queue] += 1
            self._cond.notify_all()

    def wait(self, queues: Sequence[str], seen: list[int], timeout: float) -> bool:
        """Wait up to ``timeout`` s for a bump of ``queues`` after ``seen``; False on timeout or close."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self.closed:
                if [self._counts[q] for q in queues] != seen:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return False

    def after_fork_in_child(self) -> None:
        """A fresh lock for a forked child (a thread of the parent may have held this one)."""
        self._cond = threading.Condition()

    def close(self) -> None:
        """Wake every waiter for good."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class Listener:
    """A daemon thread LISTENing on ``channel`` over its own connection, bumping ``signals``.

    ``healthy`` is True while it is connected and listening; waiters poll while it is False.
    """

    def __init__(self, engine: Engine, channel: str, signals: Signals) -> None:
        self._engine = engine
        self._channel = channel
        self._signals = signals
        self._stop = threading.Event()
        self.healthy = False
        self._thread = threading.Thread(target=self._run, name=f"taskgate-listen-{channel}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and wait (briefly) for the thread to close its connection."""
        self._stop.set()
        self._thread.join(timeout=_LISTEN_SLICE * 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:  # any failure: fall back to polling, then reconnect
                self.healthy = False
                log.warning("taskgate LISTEN on %s failed, polling instead: %s", self._channel, exc)
                self._stop.wait(_RECONNECT_PAUSE)

    def _listen(self) -> None:
        raw = self._engine.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()  # ours for good: never handed back to the pool in LISTEN state
        try:
            conn.autocommit = True
            from psycopg import sql

            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self.healthy = True
            while not self._stop.is_set():
                # One bump per notification as it arrives: collecting the whole slice first
                # would delay every wake-up by up to _LISTEN_SLICE.
                for note in conn.notifies(timeout=_LISTEN_SLICE):
                    self._signals.bump([note.payload])
                    if self._stop.is_set():
                        break
        finally:
            self.healthy = False
            conn.close()
