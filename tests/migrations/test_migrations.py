"""The migrations build exactly the schema the models describe, on every SQL database."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from helpers.sql_databases import make_tables, mysql_database
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, inspect, text
from sqlalchemy.schema import CreateTable

from taskgate.alembic import SCRIPT_LOCATION
from taskgate.brokers.base import NewTask
from taskgate.brokers.params import Claimed
from taskgate.brokers.sql import SchemaError, SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.migrate import downgrade, main, upgrade
from taskgate.models import NAMING_CONVENTION, SCHEMA_REVISION, Models, models_for, mount
from taskgate.task import Filter, Status
from taskgate.testing import steps


def drift(url: str, models: Models) -> list[Any]:
    """alembic's autogenerate diff between the database at ``url`` and ``models``."""
    names = {t.name for t in models.tables}
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, type_, _: type_ != "table" or name in names,
                },
            )
            return list(compare_metadata(context, models.metadata))
    finally:
        engine.dispose()


def table_names(url: str) -> set[str]:
    engine = create_engine(normalize_url(url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_the_models_are_at_the_migrations_head() -> None:
    script = ScriptDirectory.from_config(_script_config())
    assert script.get_heads() == [SCHEMA_REVISION]


def test_upgrading_an_empty_database_to_head_leaves_no_drift(database_url: str) -> None:
    upgrade(database_url)

    assert drift(database_url, models_for("taskgate_")) == []


def test_a_migrated_database_serves_a_broker_that_does_not_create_tables(database_url: str) -> None:
    upgrade(database_url)
    broker = SQLBroker(database_url, create_tables=False)
    try:
        (task,) = steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
        assert broker.get("a") == task
    finally:
        broker.close()


def index_predicates(url: str, table: str = "taskgate_tasks") -> dict[str, str | None]:
    """Each index of ``table`` -> its predicate as PostgreSQL prints it (None: over every row)."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            indexes = inspect(conn).get_indexes(table)
    finally:
        engine.dispose()
    return {str(ix["name"]): ix.get("dialect_options", {}).get("postgresql_where") for ix in indexes}


# The predicates the models give, as PostgreSQL prints them back.
PARTIAL_ON_POSTGRESQL = {
    "ix_taskgate_tasks_claim": "ready",
    "ix_taskgate_tasks_business_key": "(business_key IS NOT NULL)",
}


def test_postgresql_keeps_claim_and_business_key_indexes_partial_after_upgrade(postgresql_url: str) -> None:
    upgrade(postgresql_url)

    predicates = index_predicates(postgresql_url)
    assert {name: predicates[name] for name in PARTIAL_ON_POSTGRESQL} == PARTIAL_ON_POSTGRESQL
    assert predicates["ix_taskgate_tasks_status_created"] is None


def test_postgresql_tables_made_by_the_broker_have_the_migrations_partial_indexes(
    postgresql_url: str,
) -> None:
    make_tables(postgresql_url)

    predicates = index_predicates(postgresql_url)
    assert {name: predicates[name] for name in PARTIAL_ON_POSTGRESQL} == PARTIAL_ON_POSTGRESQL


def test_postgresql_downgrade_to_0001_indexes_every_row_again(postgresql_url: str) -> None:
    upgrade(postgresql_url)
    downgrade(postgresql_url, "0001")

    assert set(index_predicates(postgresql_url).values()) == {None}
    upgrade(postgresql_url)  # and back: the step runs both ways
    assert index_predicates(postgresql_url)["ix_taskgate_tasks_claim"] == "ready"


def string_collations(url: str) -> dict[str, str]:
    """Each VARCHAR column of taskgate's tables (``table.column``) -> its collation (MySQL)."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND DATA_TYPE = 'varchar' "
                    "AND TABLE_NAME LIKE 'taskgate\\_%' AND TABLE_NAME <> 'taskgate_alembic_version'"
                )
            ).all()
    finally:
        engine.dispose()
    return {f"{table}.{column}": collation for table, column, collation in rows}


# taskgate's VARCHAR columns: ids, types, queues, keys, groups, statuses, lease tokens and step
# names (21: the steps table's task_id and name, issue 39).
STRING_COLUMNS = 21


def test_mysql_string_columns_compare_exactly_whether_migrated_or_made_by_the_broker(mysql_url: str) -> None:
    """Both ways to a schema give every string column the server's NO PAD binary collation
    (the local server is MariaDB: utf8mb4_nopad_bin), never utf8mb4_bin, which pads."""
    upgrade(mysql_url)
    migrated = string_collations(mysql_url)
    with mysql_database() as created_url:
        make_tables(created_url)
        created = string_collations(created_url)

    assert len(migrated) == STRING_COLUMNS
    assert migrated == created
    assert set(migrated.values()) == {"utf8mb4_nopad_bin"}


def test_mysql_8_gets_its_own_no_pad_collation_and_mariadb_its_own() -> None:
    """The offline SQL (no server to ask) names MySQL 8's collation for a mysql:// URL and
    MariaDB's for a mariadb:// one; a live connection tells them apart by the server."""
    from taskgate.brokers.sql.engine import normalize_url as url_of

    for scheme, collation, other in (
        ("mysql", "utf8mb4_0900_bin", "utf8mb4_nopad_bin"),
        ("mariadb", "utf8mb4_nopad_bin", "utf8mb4_0900_bin"),
    ):
        dialect = url_of(f"{scheme}://u@h/db").get_dialect()()
        (keys,) = [t for t in models_for("taskgate_").tables if t.name == "taskgate_business_keys"]
        ddl = str(CreateTable(keys).compile(dialect=dialect))
        assert f"COLLATE {collation}" in ddl and other not in ddl


def _claim_metered(broker: SQLBroker, limit: int) -> Claimed:
    """A claim of queue ``metered`` within the quota ``api`` (10 units an hour)."""
    hour = timedelta(hours=1)
    return steps.claim_within_quota(broker, "metered", limit, hour, key="api", quota_limit=10, period=hour)


def test_mysql_0002_to_0003_keeps_the_rows_and_tells_trailing_spaces_apart(mysql_url: str) -> None:
    """Rows stored, the schema taken down to 0002 (utf8mb4_bin, which pads) and refused there
    with the command that upgrades it; upgraded, the rows are all there and 'k' and 'k ',
    'jobs' and 'jobs ' are told apart."""
    broker = SQLBroker(mysql_url)
    try:
        steps.enqueue(broker, [NewTask(id="p", type="t", queue="jobs", business_key="k")])
        (child,) = steps.enqueue(broker, [NewTask(id="c", type="t", queue="jobs", depends_on=("p",))])
        (lease,) = steps.claim(broker, "jobs", 5, timedelta(seconds=300))
        steps.enqueue(broker, [NewTask(id=f"m{n}", type="t", queue="metered") for n in range(3)])
        grant = _claim_metered(broker, 3).quota
    finally:
        broker.close()
    downgrade(mysql_url, "0002")
    assert set(string_collations(mysql_url).values()) == {"utf8mb4_bin"}

    shown = normalize_url(mysql_url).render_as_string(hide_password=True)
    command = re.escape(f"is at 0002, need 0007: run `taskgate-migrate upgrade {shown}`") + r"$"
    for create_tables in (False, True):  # tables there already: nothing to create, the check refuses
        with pytest.raises(SchemaError, match=command):
            first_call(SQLBroker(mysql_url, create_tables=create_tables))

    upgrade(mysql_url)
    assert set(string_collations(mysql_url).values()) == {"utf8mb4_nopad_bin"}
    assert drift(mysql_url, models_for("taskgate_")) == []
    broker = SQLBroker(mysql_url, create_tables=False)
    try:
        assert lease.task.id == "p"
        assert broker.get("c") == child
        assert steps.history(broker, "k") == [broker.get("p")]
        (padded,) = steps.enqueue(broker, [NewTask(id="p ", type="t", queue="jobs ", business_key="k ")])
        assert steps.history(broker, "k ") == [padded]
        assert [t.id for t in steps.history(broker, "k")] == ["p"]
        assert [held.task.id for held in steps.claim(broker, "jobs ", 5, timedelta(seconds=30))] == ["p "]
        assert (
            steps.ack(broker, "p", lease.token, b"done").status is Status.COMPLETED
        )  # the lease row survived
        assert broker.get("c").status is Status.PENDING  # and the edge: the child woke
        steps.enqueue(broker, [NewTask(id=f"n{n}", type="t", queue="metered") for n in range(10)])
        assert grant is not None and grant.granted == 3
        assert len(_claim_metered(broker, 10).leases) == 10 - grant.granted  # the window row survived
        assert len(broker.list(Filter())) == 16
    finally:
        broker.close()


def test_downgrading_to_base_drops_every_taskgate_table(database_url: str) -> None:
    upgrade(database_url)
    downgrade(database_url, "base")

    assert table_names(database_url) <= {"taskgate_alembic_version"}


def test_migrations_honour_a_table_prefix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'prefixed.db'}"

    assert main(["upgrade", url, "--prefix", "other_"]) == 0

    assert "other_tasks" in table_names(url)
    assert "taskgate_tasks" not in table_names(url)
    assert drift(url, models_for("other_")) == []


def test_tables_made_by_the_broker_match_the_migrations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'created.db'}"
    make_tables(url)

    upgrade(url)  # already stamped at head by the broker: nothing to do, nothing fails

    assert drift(url, models_for("taskgate_")) == []


def test_a_broker_on_an_unmigrated_database_says_how_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"

    broker = SQLBroker(url, create_tables=False)  # connects at its first call, not here

    with pytest.raises(SchemaError, match=r"at nothing, need 0007: run `taskgate-migrate upgrade sqlite:///"):
        first_call(broker)


def test_a_broker_on_a_database_at_another_revision_names_both(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    make_tables(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE taskgate_alembic_version SET version_num = '0000'")
    engine.dispose()

    with pytest.raises(SchemaError, match=r"is at 0000, need 0007: run `taskgate-migrate upgrade"):
        first_call(SQLBroker(url, create_tables=False))


def test_tables_mount_into_an_application_metadata_next_to_its_own(tmp_path: Path) -> None:
    app_metadata = MetaData(naming_convention=NAMING_CONVENTION)
    Table("app_users", app_metadata, Column("id", Integer, primary_key=True), Column("name", String(50)))
    mounted = mount(app_metadata, prefix="app_tg_")
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    app_metadata.create_all(engine)

    broker = SQLBroker(engine, table_prefix="app_tg_", create_tables=False)
    try:
        steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
        assert [lease.task.id for lease in steps.claim(broker, "q", 5, timedelta(seconds=30))] == ["a"]
    finally:
        broker.close()
    assert set(inspect(engine).get_table_names()) == {"app_users", *(t.name for t in mounted.tables)}
    engine.dispose()


def test_an_application_autogenerate_sees_the_mounted_tables(tmp_path: Path) -> None:
    app_metadata = MetaData()
    Table("app_users", app_metadata, Column("id", Integer, primary_key=True))
    mounted = mount(app_metadata, prefix="app_tg_")
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), app_metadata)
    engine.dispose()

    added = {op[1].name for op in diff if op[0] == "add_table"}
    assert added == {"app_users", *(t.name for t in mounted.tables)}


def first_call(broker: SQLBroker) -> None:
    """The broker's first call, which prepares (or checks) the schema; closed after it."""
    try:
        broker.counts()
    finally:
        broker.close()


def _script_config() -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    return config


def test_0007_gives_tasks_stored_before_it_priority_0_and_claims_by_priority(database_url: str) -> None:
    """Tasks stored at 0006 (the column dropped by the downgrade) come back at priority 0 and are
    claimed after a task of a higher priority, through the rebuilt claim index."""
    upgrade(database_url)
    broker = SQLBroker(database_url, create_tables=False)
    try:
        steps.enqueue(broker, [NewTask(id="old", type="t", queue="q", priority=5)])
    finally:
        broker.close()
    downgrade(database_url, "0006")
    upgrade(database_url)
    assert drift(database_url, models_for("taskgate_")) == []
    broker = SQLBroker(database_url, create_tables=False)
    try:
        assert broker.get("old").priority == 0
        steps.enqueue(broker, [NewTask(id="new", type="t", queue="q", priority=1)])
        leases = steps.claim(broker, "q", 2, timedelta(seconds=30))
        assert [(lease.task.id, lease.task.priority) for lease in leases] == [("new", 1), ("old", 0)]
    finally:
        broker.close()
