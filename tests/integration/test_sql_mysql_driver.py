"""MySQL's statements shaped for PyMySQL: id lists quoted by the driver (`MySQLTraits.listed`),
matching as an ``IN`` list does; leases stored under ids of any characters; payloads and
results against ``max_allowed_packet``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from helpers.mariadb_servers import MariaDBServer, require_mariadb_binaries
from helpers.sql_databases import mysql_database
from sqlalchemy import create_engine, event, select
from sqlalchemy.dialects import mysql

from taskgate.brokers.params import Claim, Complete, Submit
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.dialects import MySQLTraits
from taskgate.brokers.sql.engine import normalize_url
from taskgate.errors import BrokerError
from taskgate.models import models_for
from taskgate.task import Filter
from taskgate.testing import steps
from taskgate.testing.contract._support import new_task

LEASE = timedelta(seconds=30)


@pytest.fixture
def traced(mysql_url):
    """A broker on an app's engine whose cursor events record every statement sent."""
    engine = create_engine(normalize_url(mysql_url))
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    broker = SQLBroker(engine)
    yield broker, statements
    broker.close()
    engine.dispose()


# Id lists quoted by the driver (`MySQLTraits.listed`): one statement text for any length.


def _ids_matching(url: str, driver_quotes_lists: bool, ids: list[str]) -> list[str]:
    engine = create_engine(normalize_url(url))
    models = models_for("taskgate_")
    traits = MySQLTraits("pymysql" if driver_quotes_lists else "mariadbconnector")
    task = models.task.__table__
    stmt = select(task.c.id).where(traits.listed(task.c.id, "p_ids")).order_by(task.c.id)
    try:
        with engine.connect() as conn:
            return [row.id for row in conn.execute(stmt, {"p_ids": ids})]
    finally:
        engine.dispose()


def test_mysql_id_lists_match_as_an_in_list_does_whatever_they_hold(mysql_url):
    broker = SQLBroker(mysql_url)
    try:
        stored = [t.id for t in steps.enqueue(broker, [new_task(), new_task(), new_task()])]
    finally:
        broker.close()
    odd = "x') OR ('1'='1"  # quoted by the driver, never read as SQL
    for quoted in (True, False):
        assert _ids_matching(mysql_url, quoted, [stored[2], stored[0], stored[2], odd]) == sorted(
            [stored[0], stored[2]]
        )
        assert _ids_matching(mysql_url, quoted, [odd]) == []
    assert _ids_matching(mysql_url, True, []) == []  # (NULL): nothing, where () would not parse


def test_mysql_id_lists_keep_one_statement_text_so_their_statements_run_prepared(traced):
    broker, statements = traced
    steps.enqueue(broker, [new_task() for _ in range(5)])
    for size in (2, 3):
        leases = steps.claim(broker, "q", size, LEASE)
        steps.ack_many(broker, [(lease.task.id, lease.token, None) for lease in leases])
    marks = {s for s in statements if s.lstrip().upper().startswith("UPDATE") and "claims" in s}
    assert len(marks) == 1  # the claims of 2 and of 3 tasks sent the same text
    assert "IN %(p_ids)s" in marks.pop()
    drops = {s for s in statements if s.lstrip().upper().startswith("DELETE")}
    assert len(drops) == 1 and "IN %(p_ids)s" in drops.pop()


def test_mysql_drivers_other_than_pymysql_get_an_expanding_in() -> None:
    task = models_for("taskgate_").task.__table__
    for driver, expanding in (("pymysql", False), ("mysqldb", True), ("mariadbconnector", True)):
        clause = MySQLTraits(driver).listed(task.c.id, "p_ids")
        sql = str(select(task.c.id).where(clause).compile(dialect=mysql.dialect()))
        assert ("POSTCOMPILE" in sql) is expanding, (driver, sql)


def test_mysql_leases_of_tasks_with_odd_ids_are_stored_under_those_ids(mysql_url):
    """A claim's lease rows hold their tasks' ids exactly, whatever characters those hold."""
    odd_ids = ['quote\'d "id"', "back\\slash", "ü 中文 🙂", "per%cent %(x)s", "x" * 255]
    broker = SQLBroker(mysql_url)
    try:
        steps.enqueue(broker, [new_task(id=task_id) for task_id in odd_ids])
        leases = steps.claim(broker, "q", len(odd_ids), LEASE)
        assert sorted(lease.task.id for lease in leases) == sorted(odd_ids)
        assert {broker.get(task_id).status for task_id in odd_ids} == {"running"}
        for lease in leases:  # each lease row holds its task's id and token: the ack finds it
            assert steps.ack(broker, lease.task.id, lease.token, None).status == "completed"
        assert {t.status for t in broker.list(Filter())} == {"completed"}
    finally:
        broker.close()


# Payloads and results against max_allowed_packet. PyMySQL sends bytes as hex, two characters
# a byte, so a value of more than about half the packet makes a statement the server refuses
# (error 1153), ending the session. The server is a private one: max_allowed_packet is GLOBAL,
# and the shared server's must stay as it is for every other test.

SMALL_PACKET = 256 * 1024


@pytest.fixture(scope="module")
def small_packet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private MariaDB whose max_allowed_packet is `SMALL_PACKET`; its server URL."""
    require_mariadb_binaries()
    server = MariaDBServer(
        tmp_path_factory.mktemp("mariadb"), options=[f"--max-allowed-packet={SMALL_PACKET}"]
    ).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def small_packet(small_packet_server: str) -> Iterator[tuple[SQLBroker, SQLBroker]]:
    """Two brokers on a fresh database of the private server: one to test, one to look."""
    with mysql_database(small_packet_server) as url:
        broker, onlooker = SQLBroker(url), SQLBroker(url)
        try:
            yield broker, onlooker
        finally:
            broker.close()
            onlooker.close()


def test_mysql_a_payload_of_60_percent_of_max_allowed_packet_is_refused_clearly_then_the_next_submit_works(
    small_packet: tuple[SQLBroker, SQLBroker],
) -> None:
    broker, onlooker = small_packet
    size = SMALL_PACKET * 6 // 10  # fits the packet raw, but not once sent as hex
    clear = rf"payload of task big is {size} bytes.*max_allowed_packet is {SMALL_PACKET} bytes"
    for snapshots in (True, False):
        with pytest.raises(ValueError, match=clear) as caught:
            broker.submit(Submit((new_task(id="big", payload=b"x" * size),), snapshots=snapshots))
        assert not isinstance(caught.value, BrokerError)  # bad input, not a store to retry
    assert onlooker.counts() == {}

    (after,) = steps.enqueue(broker, [new_task(payload=b"fits")])
    assert onlooker.get(after.id) == after  # committed, on a sound connection
    largest = steps.enqueue(broker, [new_task(payload=b"y" * (SMALL_PACKET // 2 - 64 * 1024))])
    assert onlooker.get(largest[0].id).payload == largest[0].payload


def test_mysql_an_ack_of_a_result_too_large_for_the_server_is_refused_and_changes_nothing(
    small_packet: tuple[SQLBroker, SQLBroker],
) -> None:
    broker, onlooker = small_packet
    (task,) = steps.enqueue(broker, [new_task()])
    (lease,) = steps.claim(broker, "q", 1, LEASE)
    too_large = b"r" * (SMALL_PACKET * 6 // 10)
    clear = rf"result of task {task.id} is {len(too_large)} bytes.*max_allowed_packet is {SMALL_PACKET}"
    with pytest.raises(ValueError, match=clear) as caught:
        steps.ack(broker, task.id, lease.token, too_large)
    assert not isinstance(caught.value, BrokerError)
    with pytest.raises(ValueError, match=clear):
        steps.ack_many(broker, [(task.id, lease.token, too_large)])
    with pytest.raises(ValueError, match=clear):  # before the claim it carries
        broker.claim(Claim("q", 1, LEASE, acks=(Complete(task.id, lease.token, too_large),)))

    running = onlooker.get(task.id)
    assert (running.status, running.result) == ("running", None)
    assert steps.heartbeat(broker, task.id, lease.token, LEASE).cancel_requested is False  # still its lease
    assert steps.ack(broker, task.id, lease.token, b"small").result == b"small"


def test_mysql_a_statement_over_max_allowed_packet_fails_clearly_and_breaks_no_connection(
    small_packet: tuple[SQLBroker, SQLBroker],
) -> None:
    """Values each small enough, one statement too big for them all: the server refuses it
    (1153) and ends the session; the connection is replaced, so the next calls, on the held
    connection in autocommit and in a transaction, work and are committed."""
    broker, onlooker = small_packet
    many = [new_task(payload=b"x" * 60_000) for _ in range(3)]  # one multi-row INSERT of ~360 KB
    for _ in range(2):
        with pytest.raises(ValueError, match=r"larger than this MySQL server's max_allowed_packet"):
            steps.enqueue(broker, many)
        assert {t.id for t in onlooker.list(Filter())}.isdisjoint(t.id for t in many)  # none stored
        (alone,) = steps.enqueue(broker, [new_task(payload=b"after")])
        assert onlooker.get(alone.id) == alone
        two = steps.enqueue(broker, [new_task(), new_task()])
        assert [onlooker.get(t.id) for t in two] == two
        (lease,) = steps.claim(broker, "q", 1, LEASE)
        assert steps.ack(broker, lease.task.id, lease.token, None).status == "completed"
