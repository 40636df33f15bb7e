"""A forked child of a process holding an `SQLBroker` (a pre-forking server's workers,
``multiprocessing``'s fork start method): it opens sessions of its own, pooled and held alike,
and never uses nor ends its parent's, even when it closes the broker (`taskgate.forks`)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
from gate_helpers import GUARD, make_gate
from sql_sessions import held_session, hot

from taskgate import Task
from taskgate.brokers.sql import SQLBroker
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

LEASE = timedelta(seconds=30)


def _in_child(body: Callable[[], bool]) -> int:
    """Fork; the child runs ``body`` and exits 0 when it returned True (1 if it raised, 2 if
    False, killed by SIGALRM after `GUARD` seconds); the parent gets the child's exit code."""
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through its exit status
        code = 1
        try:
            # A child stuck on a lock is killed by the alarm instead of hanging the test.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(int(GUARD))
            code = 0 if body() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_neither_uses_nor_ends_its_parents_sessions(sql_server):
    broker = SQLBroker(sql_server.url)
    try:
        steps.enqueue(broker, [new_task()])
        with broker._engine.connect() as conn:
            parent_pooled = sql_server.session_of(conn)
        parent_held = held_session(broker, sql_server)

        def child() -> bool:
            with broker._engine.connect() as conn:
                pooled = sql_server.session_of(conn)
            steps.enqueue(broker, [new_task()])
            held = held_session(broker, sql_server)
            broker.close()  # must not end the parent's sessions through the inherited sockets
            return {pooled, held}.isdisjoint({parent_pooled, parent_held})

        assert _in_child(child) == 0
        with broker._engine.connect() as conn:
            assert sql_server.session_of(conn) == parent_pooled  # open, and back in the pool
        assert held_session(broker, sql_server) == parent_held
        steps.enqueue(broker, [new_task()])
        assert len(steps.claim(broker, "q", 5, LEASE)) == 3
    finally:
        broker.close()


def test_a_gate_made_before_the_fork_works_in_the_child_and_the_parent_reads_its_work(sql_server):
    """A pre-forking server's way: the app makes its gate, and uses it, before the fork; each
    worker process starts it after."""
    broker = SQLBroker(sql_server.url)
    gate = make_gate(broker)

    @gate.handler("q")
    async def echo(task: Task) -> str:
        return task.id

    async def submit() -> str:
        return await gate.submit("q")

    try:
        task_id = anyio.run(submit)  # the parent's connections are open and pooled

        def child() -> bool:
            async def work() -> bytes | None:
                async with gate:
                    return await gate.wait(task_id, timeout=GUARD)

            result = anyio.run(work)
            broker.close()
            return result is not None

        assert _in_child(child) == 0
        assert broker.get(task_id).result_json() == task_id  # read through the parent's sessions
    finally:
        broker.close()


def test_a_child_forked_during_a_call_on_the_held_connection_holds_one_of_its_own(networked_sql):
    """The parent's call (another thread's, in an application) had taken the held connection
    when the fork happened: the child's calls still get a held connection, not the pool's.
    (Not SQLite: the parent's call would hold the file's write lock the child waits for.)"""
    broker = SQLBroker(networked_sql.url)
    try:
        steps.enqueue(broker, [new_task()])

        def child() -> bool:
            steps.enqueue(broker, [new_task()])
            with hot(broker).use():
                return broker._engine.pool.checkedout() == 0  # held, not lent by the pool

        with hot(broker).use():
            assert _in_child(child) == 0
        assert len(steps.claim(broker, "q", 5, LEASE)) == 2
    finally:
        broker.close()


def test_a_child_forked_while_a_parent_thread_holds_the_brokers_locks_is_not_stuck(sql_server):
    """A thread that held a lock at the fork does not exist in the child to release it: the
    child's broker starts from fresh locks (its wake-up board's, its server clock's, SQLite's
    writer's turn)."""
    broker = SQLBroker(sql_server.url)
    locks = [broker._signals._cond, broker._server_clock._lock, broker._writers or threading.Lock()]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        holding.set()
        release.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(GUARD)

        def child() -> bool:
            # Each would wait forever on a lock the parent's thread held at the fork.
            steps.enqueue(broker, [new_task()])
            return broker.wait_for_work(["q"], 0.0) and len(steps.claim(broker, "q", 5, LEASE)) == 1

        assert _in_child(child) == 0
    finally:
        release.set()
        holder.join()
        broker.close()


def test_a_forked_child_listens_for_other_processes_wakeups_on_its_own_connection(postgresql_url):
    """The parent's LISTEN runs in a thread the child does not have: the child starts its own,
    and a task another process submits bumps the child's wake-up board."""
    broker = SQLBroker(postgresql_url, poll_interval=60)
    submitter = SQLBroker(postgresql_url)
    ready_read, ready_write = os.pipe()

    def submit_when_listening() -> None:
        if os.read(ready_read, 1):
            steps.enqueue(submitter, [new_task()])  # NOTIFY from another connection

    def child() -> bool:
        broker.wait_for_work(["elsewhere"], 0.0)  # starts the child's listener
        deadline = time.monotonic() + GUARD
        while not (broker._listener is not None and broker._listener.healthy):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)  # another thread's LISTEN: nothing to wait on but its flag
        seen = broker._signals.seen(["q"])
        os.write(ready_write, b"x")
        return broker._signals.wait(["q"], seen, GUARD)

    submitting = threading.Thread(target=submit_when_listening)
    submitting.start()
    try:
        broker.wait_for_work(["elsewhere"], 0.0)  # starts the parent's listener
        assert _in_child(child) == 0
    finally:
        os.close(ready_write)  # ends the submitting thread's read if the child never wrote
        submitting.join(GUARD)
        os.close(ready_read)
        submitter.close()
        broker.close()
