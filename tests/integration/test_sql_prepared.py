"""Prepared statements read and write exactly what SQLAlchemy's own execution would."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    event,
    insert,
    literal_column,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import DBAPIError, IntegrityError, StatementError

from taskgate.brokers.sql.dialects import traits_for
from taskgate.brokers.sql.engine import normalize_url
from taskgate.brokers.sql.prepared import Prepared, PreparedCache
from taskgate.brokers.sql.tx import Tx
from taskgate.models import models_for
from taskgate.models.types import Blob, UTCDateTime

metadata = MetaData()
things = Table(
    "taskgate_test_things",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("at", UTCDateTime()),
    Column("flag", Boolean),
    Column("blob", Blob),
    Column("n", Integer),
)

T0 = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
ROWS = [
    {"id": "a", "at": T0, "flag": True, "blob": b"\x00payload", "n": 1},
    {"id": "b", "at": T0 + timedelta(seconds=1), "flag": False, "blob": None, "n": 2},
    {"id": "c", "at": None, "flag": True, "blob": b"", "n": 3},
]

# Only the flagged rows from ``p_min`` up: a required parameter and a constant (``true()``).
FLAGGED = (
    select(things).where(things.c.n >= bindparam("p_min"), things.c.flag == true()).order_by(things.c.id)
)
BUMP = (
    update(things)
    .where(things.c.id == bindparam("p_id"))
    .values(n=things.c.n + 10, flag=False, at=bindparam("p_at", type_=UTCDateTime()))
)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'prepared.db'}"
    else:
        url = request.getfixturevalue(f"{request.param}_url")
    engine = create_engine(normalize_url(url))
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(things), ROWS)
    yield engine
    metadata.drop_all(engine)
    engine.dispose()


def _prepared(statement: Any, engine: Engine) -> Prepared:
    prepared = Prepared.of(statement, engine.dialect)
    assert prepared is not None
    return prepared


def _sqlalchemy_rows(engine: Engine, statement: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(statement, params).mappings()]


def test_rows_are_read_as_sqlalchemy_reads_them(engine: Engine) -> None:
    with engine.connect() as conn:
        rows = _prepared(FLAGGED, engine).rows(conn, {"p_min": 1})
    assert rows == _sqlalchemy_rows(engine, FLAGGED, {"p_min": 1})
    assert [row["id"] for row in rows] == ["a", "c"]
    assert rows[0]["at"] == T0 and rows[0]["at"].tzinfo is UTC  # aware UTC, microseconds kept
    assert rows[0]["blob"] == b"\x00payload" and rows[1]["blob"] == b""
    assert rows[0]["flag"] is True


def test_writes_carry_constants_and_processed_parameters(engine: Engine) -> None:
    other_zone = T0.astimezone(timezone(timedelta(hours=5)))  # stored as the same instant
    with engine.begin() as conn:
        assert _prepared(BUMP, engine).run(conn, {"p_id": "a", "p_at": other_zone}) == 1
        assert _prepared(BUMP, engine).run(conn, {"p_id": "nope", "p_at": other_zone}) == 0
    (row,) = _sqlalchemy_rows(engine, select(things).where(things.c.id == "a"), {})
    assert (row["n"], row["flag"], row["at"]) == (11, False, T0)


def test_many_rows_in_one_call(engine: Engine) -> None:
    new = [{"id": f"m{n}", "at": T0, "flag": True, "blob": bytes([n]), "n": 100 + n} for n in range(5)]
    with engine.begin() as conn:
        _prepared(insert(things), engine).run_many(conn, new)
    read = _sqlalchemy_rows(engine, select(things).where(things.c.n >= 100).order_by(things.c.n), {})
    assert read == new


def test_with_cursor_listeners_the_statements_go_through_sqlalchemy_and_read_the_same(engine: Engine) -> None:
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_: seen.append(sql))
    prepared = _prepared(FLAGGED, engine)
    with engine.connect() as conn:
        rows = prepared.rows(conn, {"p_min": 2})
    assert seen == [prepared.sql]
    assert rows == _sqlalchemy_rows(engine, FLAGGED, {"p_min": 2}) and [r["id"] for r in rows] == ["c"]


def test_a_database_error_is_raised_as_sqlalchemy_raises_it_and_changes_nothing(engine: Engine) -> None:
    with pytest.raises(IntegrityError), engine.begin() as conn:
        _prepared(insert(things), engine).run_many(conn, [{**ROWS[0], "id": "fresh"}, ROWS[1]])
    assert len(_sqlalchemy_rows(engine, select(things), {})) == len(ROWS)  # rolled back whole


def test_a_statement_whose_sql_depends_on_its_parameters_is_left_to_sqlalchemy(engine: Engine) -> None:
    expanding = select(things).where(things.c.id.in_(bindparam("p_ids", expanding=True)))
    assert Prepared.of(expanding, engine.dialect) is None
    cache = PreparedCache()
    assert cache.get(expanding, engine.dialect) is None
    assert cache.get(FLAGGED, engine.dialect) is cache.get(FLAGGED, engine.dialect)  # compiled once
    for n in range(PreparedCache.MAX_ENTRIES + 10):  # statements built per call: bounded
        cache.get(select(things).where(things.c.n == n), engine.dialect)
    assert len(cache) <= PreparedCache.MAX_ENTRIES


def test_a_connection_that_died_is_invalidated_and_the_pool_recovers(postgresql_url: str) -> None:
    engine = create_engine(normalize_url(postgresql_url), pool_size=1, max_overflow=0)
    metadata.create_all(engine)
    admin = create_engine(normalize_url(postgresql_url), isolation_level="AUTOCOMMIT")
    try:
        prepared = _prepared(FLAGGED, engine)
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with admin.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DBAPIError) as raised:
                prepared.rows(conn, {"p_min": 0})
            assert raised.value.connection_invalidated
            assert conn.invalidated
        with engine.connect() as conn:  # the pool's one connection was replaced, not reused
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
            assert prepared.rows(conn, {"p_min": 0}) == []
    finally:
        metadata.drop_all(engine)
        admin.dispose()
        engine.dispose()


@pytest.mark.parametrize(
    "moment",
    [
        T0,
        datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC),  # no microseconds: still written as .000000
        datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC),  # a year below 1000: still four digits
        T0.astimezone(timezone(timedelta(hours=-7))),  # another zone: stored as the UTC instant
    ],
)
def test_sqlite_times_are_stored_as_sqlalchemys_datetime_text_and_read_back_aware(
    moment: datetime, tmp_path: Path
) -> None:
    """UTCDateTime's own SQLite conversion writes exactly the text SQLAlchemy's DATETIME writes
    (so old and new rows compare and sort alike) and reads it back as aware UTC."""
    engine = create_engine(f"sqlite:///{tmp_path / 'times.db'}")
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(insert(things), [{"id": "x", "at": moment}])
            stored = conn.execute(text("SELECT at FROM taskgate_test_things")).scalar_one()
            read = conn.execute(select(things.c.at)).scalar_one()
        plain = DateTime().dialect_impl(engine.dialect).bind_processor(engine.dialect)
        assert plain is not None
        assert stored == plain(moment.astimezone(UTC).replace(tzinfo=None))
        assert read == moment and read.tzinfo is UTC
        with pytest.raises(StatementError, match="timezone-aware"), engine.begin() as conn:
            conn.execute(insert(things), [{"id": "naive", "at": datetime(2026, 12, 1)}])
    finally:
        engine.dispose()


def test_statement_logging_sees_prepared_statements(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    prepared = _prepared(FLAGGED, engine)
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"), engine.connect() as conn:
        rows = prepared.rows(conn, {"p_min": 2})
    assert [r["id"] for r in rows] == ["c"]
    assert any(record.getMessage() == prepared.sql for record in caplog.records)


def test_a_connection_translating_schemas_runs_the_translated_statement(tmp_path: Path) -> None:
    """The SQL compiled once names no schema; with a ``schema_translate_map`` the transition's
    statements are compiled per execution, so they reach the translated tables."""
    engine = create_engine(f"sqlite:///{tmp_path / 'main.db'}")
    event.listen(
        engine, "connect", lambda dbapi, _: dbapi.execute(f"ATTACH '{tmp_path / 'other.db'}' AS other")
    )
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(insert(things), ROWS)
        translated = engine.execution_options(schema_translate_map={None: "other"})
        metadata.create_all(translated)
        with translated.begin() as conn:
            conn.execute(insert(things), [{**ROWS[2], "id": "in-other"}])
        with translated.connect() as conn:
            tx = Tx(
                conn, models_for("taskgate_"), traits_for("sqlite"), lambda _: T0, prepared=PreparedCache()
            )
            assert [row["id"] for row in tx.fetch(FLAGGED, {"p_min": 0})] == ["in-other"]
            assert len(tx.prepared or ()) == 0  # nothing was compiled once for this connection
        with engine.connect() as conn:
            tx = Tx(
                conn, models_for("taskgate_"), traits_for("sqlite"), lambda _: T0, prepared=PreparedCache()
            )
            assert [row["id"] for row in tx.fetch(FLAGGED, {"p_min": 0})] == ["a", "c"]
            assert len(tx.prepared or ()) == 1
    finally:
        engine.dispose()


def test_numbered_sql_has_libpq_placeholders_and_keeps_literal_percent_signs() -> None:
    """A split call (`pg_split`) sends the statement with ``$n`` placeholders, each name once."""
    statement = select(
        literal_column("'100%'").label("pct"),
        bindparam("a", type_=Integer),
        bindparam("b", type_=String),
        bindparam("a", type_=Integer),
    )
    prepared = Prepared.of(statement, PGDialect_psycopg())
    assert prepared is not None
    sql, names = prepared.numbered()
    assert names == ("a", "b")
    assert "'100%'" in sql and "%%" not in sql and "%(" not in sql
    assert sql.index("$1") < sql.index("$2") < sql.rindex("$1")
