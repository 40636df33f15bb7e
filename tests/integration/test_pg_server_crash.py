"""PostgreSQL: what a broker call answered survives a server crash (a private server, killed).

The shared server is never crashed: each test starts its own (`helpers.pg_servers`), SIGKILLs
every process of it right after a call returned, and starts it again (crash recovery). The
WAL writer is set to wake every 10 s, so a commit that did not wait for the disk itself is
still in the server's buffers when the crash comes, and is lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta

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


def test_acks_carried_on_a_claim_survive_a_server_crash(server: PostgresServer) -> None:
    broker = SQLBroker(server.url, clock=ManualClock())
    try:
        steps.enqueue(broker, [new_task() for _ in range(4)])
        held = steps.claim(broker, "q", 3, TTL)
        for lease in held:  # a write that waits for the disk: the claim before it is durable too
            steps.heartbeat(broker, lease.task.id, lease.token, TTL)
        acks = tuple(Complete(lease.task.id, lease.token, b"done") for lease in held)
        claimed = broker.claim(Claim("q", 1, TTL, acks=acks))
        assert claimed.acked == [None] * 3 and claimed.failed is None and len(claimed.leases) == 1
    finally:
        broker.close()
    server.crash()  # at once: the WAL writer has not woken since
    server.start()
    broker = SQLBroker(server.url, clock=ManualClock())
    try:
        for lease in held:  # answered as completed: still completed after the crash
            assert broker.get(lease.task.id).status is Status.COMPLETED
    finally:
        broker.close()


@pytest.mark.parametrize("shared", [None, SharedLimits(workers=1)], ids=["plain", "shared-workers"])
def test_a_claim_a_crash_undoes_puts_its_task_back_as_it_was(
    server: PostgresServer, shared: SharedLimits | None
) -> None:
    """A claim does not wait for the disk: a crash may undo it. Its task is then pending with
    the claims it had, its slot free, its holder's heartbeat answers lease lost -- so the task
    runs again as the same claim number, and nothing is lost (the torture checker's
    ``undo_window``)."""
    broker = SQLBroker(server.url, clock=ManualClock())
    try:
        (task,) = steps.enqueue(broker, [new_task()])
        (held,) = broker.claim(Claim("q", 1, TTL, shared=shared)).leases
        assert held.task.claims == 1
    finally:
        broker.close()
    server.crash()  # at once: the WAL writer has not woken since
    server.start()
    broker = SQLBroker(server.url, clock=ManualClock())
    try:
        back = broker.get(task.id)
        assert (back.status, back.claims) == (Status.PENDING, 0)
        with pytest.raises(LeaseLostError):
            broker.heartbeat(Heartbeat(task.id, held.token, TTL, slot_queue="q" if shared else None))
        (again,) = broker.claim(Claim("q", 1, TTL, shared=shared)).leases
        assert (again.task.id, again.task.claims) == (task.id, 1)
    finally:
        broker.close()
