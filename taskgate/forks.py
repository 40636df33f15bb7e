"""What a forked child does with what it inherited: connections it neither uses nor closes,
threads and locks it does not have.

A child process made by ``os.fork`` (a pre-forking server's workers, ``multiprocessing`` with
the fork start method) starts with copies of its parent's sockets. Sending on one interleaves
the child's requests with the parent's on the parent's server session, and closing one
properly ends that session for both: psycopg's and PyMySQL's ``close`` say goodbye to the
server. So a child keeps every inherited connection referenced, that no finaliser runs on
it, and opens its own. It has only the thread that forked: the others' work is gone, and a
lock one of them held stays held. Objects holding such things (an SQL broker with its pool,
held connections and listener; a Redis broker's event-loop connections; the runtime's broker
threads) `register` to be told, in the child, at once after the fork
(``os.register_at_fork``), before the child can use them.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "keep_inherited", "register"]

log = logging.getLogger("taskgate")

# Whatever a forked child inherited and must never close: kept referenced for the child's life.
_INHERITED: list[object] = []


class ForkAware(Protocol):
    """An object that drops what it inherited when the process it lives in is a forked child."""

    def after_fork_in_child(self) -> None:
        """Forget the parent's connections and locks (run once in the child, at the fork)."""


_REGISTERED: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def register(obj: ForkAware) -> None:
    """Have ``obj.after_fork_in_child()`` run in every child forked while ``obj`` lives."""
    _REGISTERED.add(obj)


def keep_inherited(obj: object) -> None:
    """Keep ``obj`` (a connection, a pool of them) referenced and unclosed in this child."""
    _INHERITED.append(obj)


def _after_fork_in_child() -> None:
    for obj in list(_REGISTERED):
        try:
            obj.after_fork_in_child()
        except Exception:  # one object's failure must not leave the others the parent's
            log.exception("resetting %r in a forked child failed", obj)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
