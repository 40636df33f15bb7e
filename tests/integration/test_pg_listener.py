"""PostgreSQL's wake-up listener (`taskgate.brokers.sql.wakeups.Listener`): a LISTEN session the
server ends is opened again, and other processes' wake-ups reach the board again."""

from __future__ import annotations

import time

from gate_helpers import GUARD
from sql_sessions import postgresql_server
from sqlalchemy import text

from taskgate.brokers.sql import SQLBroker, wakeups
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task


def _listening_session(url: str, channel: str, other_than: int | None = None) -> int:
    """The session LISTENing on ``channel`` (not ``other_than``), once there is one."""
    admin = postgresql_server(url).admin()
    query = text(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND query = :listen AND pid IS DISTINCT FROM :other"
    )
    deadline = time.monotonic() + GUARD
    try:
        while True:
            with admin.connect() as conn:
                found = conn.execute(query, {"listen": f'LISTEN "{channel}"', "other": other_than}).first()
            if found is not None:
                return int(found[0])
            assert time.monotonic() < deadline, f"nobody LISTENs on {channel}"
            time.sleep(0.005)  # another thread's session: nothing to wait on but its row
    finally:
        admin.dispose()


def test_a_listener_whose_session_the_server_ends_listens_again(postgresql_url, monkeypatch):
    monkeypatch.setattr(wakeups, "_RECONNECT_PAUSE", 0.01)
    broker = SQLBroker(postgresql_url, poll_interval=60)  # no poll would find the task in time
    submitter = SQLBroker(postgresql_url)  # another broker: it reaches the first only by NOTIFY
    try:
        broker.wait_for_work(["elsewhere"], 0.0)  # starts the listener
        first = _listening_session(postgresql_url, broker._channel)
        postgresql_server(postgresql_url).terminate(first)
        _listening_session(postgresql_url, broker._channel, other_than=first)
        deadline = time.monotonic() + GUARD
        while not (broker._listener is not None and broker._listener.healthy):
            assert time.monotonic() < deadline, "the listener never came back"
            time.sleep(0.005)  # another thread's flag: nothing to wait on
        seen = broker._signals.seen(["q"])
        steps.enqueue(submitter, [new_task()])
        assert broker._signals.wait(["q"], seen, GUARD)
    finally:
        submitter.close()
        broker.close()
