"""Sessions of the SQL servers, as tests of connection handling see them (held connections,
forked children): which session a connection is, which exist, ending one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from gate_helpers import GUARD
from sqlalchemy import Connection, Engine, create_engine, text

from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.brokers.sql.held import HeldConnection


@dataclass(frozen=True)
class Server:
    """How a test names, lists and ends one backend's sessions."""

    url: str
    session_query: str | None  # this session's id; None: no server (SQLite)
    sessions_query: str | None = None  # every other session's id in the test's database
    kill: Callable[[int], str] | None = None

    def session_of(self, conn: Connection) -> int:
        if self.session_query is None:
            return id(conn.connection.dbapi_connection)  # one file, no server: the driver's object
        return int(conn.exec_driver_sql(self.session_query).scalar_one())

    def admin(self) -> Engine:
        return create_engine(normalize_url(self.url), isolation_level="AUTOCOMMIT")

    def sessions(self) -> set[int]:
        assert self.sessions_query is not None
        admin = self.admin()
        try:
            with admin.connect() as conn:
                return {int(pid) for (pid,) in conn.execute(text(self.sessions_query))}
        finally:
            admin.dispose()

    def terminate(self, session: int) -> None:
        assert self.kill is not None
        admin = self.admin()
        try:
            with admin.connect() as conn:
                conn.execute(text(self.kill(session)))
        finally:
            admin.dispose()
        self.wait_gone(session, "its termination")

    def wait_gone(self, session: int, after: str) -> None:
        deadline = time.monotonic() + GUARD
        while session in self.sessions():
            assert time.monotonic() < deadline, f"session {session} outlived {after}"
            time.sleep(0.005)  # another server process's exit: nothing to wait on but its row


def postgresql_server(url: str) -> Server:
    return Server(
        url,
        "SELECT pg_backend_pid()",
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        lambda pid: f"SELECT pg_terminate_backend({pid})",
    )


def mysql_server(url: str) -> Server:
    return Server(
        url,
        "SELECT CONNECTION_ID()",
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
        lambda pid: f"KILL {pid}",
    )


def server_for(request: pytest.FixtureRequest, tmp_path: Path) -> Server:
    """The `Server` of the fixture param ``request.param``: postgresql, mysql or sqlite (a file)."""
    if request.param == "sqlite":
        return Server(f"sqlite:///{tmp_path / 'tasks.db'}", None)
    url = request.getfixturevalue(f"{request.param}_url")
    return postgresql_server(url) if request.param == "postgresql" else mysql_server(url)


def hot(broker: SQLBroker) -> HeldConnection:
    """The broker's held connection, which a single submit and a claim run on."""
    held = broker._held
    assert held is not None
    return held


def held_session(broker: SQLBroker, server: Server, held: HeldConnection | None = None) -> int:
    with (held or hot(broker)).use() as conn:
        return server.session_of(conn)
