"""PostgreSQL: what a broker call answered survives a server crash (a private server, killed).

The shared server is never crashed: each test starts its own (`helpers.pg_servers`), SIGKILLs
every process of it right after a call returned, and starts it again (crash recovery). The
WAL writer is set to wake every 10 s, so a commit that did not wait for the disk itself is
still in the server's buffers when the crash comes, and is lost.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.pg_servers import PostgresServer, postgres_binaries

from taskgate.brokers.params import Claim, Complete, Heartbeat, SharedLimits
from taskgate.brokers.sql import SQLBroker
from taskgate.clock import ManualClock
from taskgate.errors import LeaseLostError
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

pytestmark = pytest.mark.slow

TTL = timedelta(seconds=30)


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    if postgres_binaries() is None:
        message = "initdb/postgres not installed: cannot start a private PostgreSQL"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # Nothing but the test's own commits may flush the WAL before the crash.
    quiet = ["wal_writer_delay=10000", "autovacuum=off", "checkpoint_timeout=3600", "full_page_writes=off"]
    pg = PostgresServer(settings=quiet)
    try:
        yield pg.start()
    finally:
        pg.stop()


@contextlib.contextmanager
def _broker(server: PostgresServer) -> Iterator[SQLBroker]:
    broker = SQLBroker(server.url, clock=ManualClock())
    try:
        yield broker
    finally:
        broker.close()


def _crash_and_start(server: PostgresServer) -> None:
    server.crash()  # at once: the WAL writer has not woken since
    server.start()


def test_acks_carried_on_a_claim_survive_a_server_crash(server: PostgresServer) -> None:
    with _broker(server) as broker:
        steps.enqueue(broker, [new_task() for _ in range(4)])
        held = steps.claim(broker, "q", 3, TTL)
        for lease in held:  # a write that waits for the disk: the claim before it is durable too
            steps.heartbeat(broker, lease.task.id, lease.token, TTL)
        acks = tuple(Complete(lease.task.id, lease.token, b"done") for lease in held)
        claimed = broker.claim(Claim("q", 1, TTL, acks=acks))
        assert claimed.acked == [None] * 3 and claimed.failed is None and len(claimed.leases) == 1
    _crash_and_start(server)
    with _broker(server) as broker:
        for lease in held:  # answered as completed: still completed after the crash
            assert broker.get(lease.task.id).status is Status.COMPLETED


@pytest.mark.parametrize("shared", [None, SharedLimits(workers=1)], ids=["plain", "shared-workers"])
def test_a_claim_a_crash_undoes_puts_its_task_back_as_it_was(
    server: PostgresServer, shared: SharedLimits | None
) -> None:
    """A claim does not wait for the disk: a crash may undo it. Its task is then pending with
    the claims it had, its slot free, its holder's heartbeat answers lease lost -- so the task
    runs again as the same claim number, and nothing is lost (the torture checker's
    ``undo_window``)."""
    with _broker(server) as broker:
        (task,) = steps.enqueue(broker, [new_task()])
        (held,) = broker.claim(Claim("q", 1, TTL, shared=shared)).leases
        assert held.task.claims == 1
    _crash_and_start(server)
    with _broker(server) as broker:
        back = broker.get(task.id)
        assert (back.status, back.claims) == (Status.PENDING, 0)
        with pytest.raises(LeaseLostError):
            broker.heartbeat(Heartbeat(task.id, held.token, TTL, slot_queue="q" if shared else None))
        (again,) = broker.claim(Claim("q", 1, TTL, shared=shared)).leases
        assert (again.task.id, again.task.claims) == (task.id, 1)


def test_a_crash_kills_every_backend_so_the_server_starts_again_at_once(server: PostgresServer) -> None:
    """Backends leave the postmaster's process group; a crash that killed only the group left
    them attached to the shared memory, and the start right after it refused to run."""
    sessions = [psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres") for _ in range(4)]
    backends = [session.info.backend_pid for session in sessions]
    # Busy backends (a long query checks for the postmaster's death only when it ends) as well
    # as idle ones.
    busy = [threading.Thread(target=_count_for_a_while, args=(session,)) for session in sessions[:2]]
    for thread in busy:
        thread.start()
    while _busy(server) < 2:
        time.sleep(0.01)
    server.crash()
    assert [pid for pid in backends if _alive(pid)] == []
    for thread in busy:
        thread.join()
    server.start()
    with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres") as session:
        assert session.execute("SELECT 1").fetchone() == (1,)
    for session in sessions:
        session.close()


def _count_for_a_while(session: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.OperationalError):  # the crash ends it
        session.execute("DO $$ BEGIN FOR i IN 1..2000000000 LOOP END LOOP; END $$")


def _busy(server: PostgresServer) -> int:
    with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres") as session:
        row = session.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DO %' AND state = 'active'"
            " AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
