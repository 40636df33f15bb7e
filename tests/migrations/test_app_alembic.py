"""An application's own alembic with taskgate's tables in its metadata, as a user runs it: the
real ``alembic`` CLI in a project made by ``alembic init``, on every SQL database."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from helpers.sql_databases import make_tables
from sqlalchemy import create_engine, inspect

from taskgate.brokers.base import NewTask
from taskgate.brokers.sql import SQLBroker
from taskgate.brokers.sql.engine import normalize_url
from taskgate.testing import steps

BIN = Path(sys.executable).parent

# The application's models: a table of its own, with an index and a timestamp, and (MOUNT)
# taskgate's tables mounted into the same MetaData.
APP_MODELS = """
from datetime import datetime

from sqlalchemy import MetaData, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from taskgate.models import mount


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention={"ix": "ix_%(column_0_label)s", "pk": "pk_%(table_name)s"})


class Customer(Base):
    __tablename__ = "customers"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), index=True)
    joined_at: Mapped[datetime]


if MOUNT:
    mount(Base.metadata)
"""

# What the README's recipe adds to the env.py that `alembic init` wrote.
ENV_IMPORTS = "from app_models import Base\nfrom taskgate.models import include_object\n"
HOOK = "include_object=include_object"


@dataclass
class AppProject:
    """An alembic project of an application, in a directory of its own."""

    root: Path

    def run(self, *args: str) -> str:
        """Run a command (from the environment's bin directory) in the project; its output."""
        done = subprocess.run(
            [str(BIN / args[0]), *args[1:]], cwd=self.root, capture_output=True, text=True, timeout=120
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(args)} exited with {done.returncode}:\n{output}"
        return output

    def autogenerate(self, message: str) -> str:
        """``alembic revision --autogenerate``; the ``upgrade()`` of the migration it wrote."""
        before = set(self.versions.glob("*.py"))
        self.run("alembic", "revision", "--autogenerate", "-m", message)
        (written,) = set(self.versions.glob("*.py")) - before
        text = written.read_text()
        return text[text.index("def upgrade") : text.index("def downgrade")]

    @property
    def versions(self) -> Path:
        return self.root / "migrations" / "versions"


def app_project(root: Path, url: str, *, mount: bool = True) -> AppProject:
    """``alembic init``, the app's models, and the two edits of env.py the README shows."""
    root.mkdir()
    project = AppProject(root)
    project.run("alembic", "init", "migrations")
    (root / "app_models.py").write_text(f"MOUNT = {mount}\n{APP_MODELS}")
    env = root / "migrations" / "env.py"
    text = env.read_text()
    assert text.count("target_metadata = None\n") == 1 and text.count("target_metadata=target_metadata") == 2
    text = text.replace("target_metadata = None\n", f"{ENV_IMPORTS}target_metadata = Base.metadata\n")
    text = text.replace("target_metadata=target_metadata", f"target_metadata=target_metadata, {HOOK}")
    env.write_text(text)
    ini = root / "alembic.ini"
    lines = ini.read_text().splitlines()
    (at,) = [n for n, line in enumerate(lines) if line.startswith("sqlalchemy.url = ")]
    lines[at] = f"sqlalchemy.url = {url}"
    ini.write_text("\n".join(lines) + "\n")
    return project


def assert_no_new_operations(project: AppProject) -> None:
    """A second autogenerate finds nothing to do (``alembic check`` runs it and says so)."""
    assert "No new upgrade operations detected." in project.run("alembic", "check")


def table_names(url: str) -> set[str]:
    engine = create_engine(normalize_url(url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def assert_serves_a_broker(url: str) -> None:
    """The tables the app's migration made take a task and lease it."""
    broker = SQLBroker(url, create_tables=False)
    try:
        steps.enqueue(broker, [NewTask(id="a", type="t", queue="q")])
        assert [lease.task.id for lease in steps.claim(broker, "q", 5, timedelta(seconds=30))] == ["a"]
    finally:
        broker.close()


def test_an_app_migration_with_mounted_tables_runs_as_generated_and_leaves_no_drift(
    database_url: str, tmp_path: Path
) -> None:
    project = app_project(tmp_path / "app", database_url)

    migration = project.autogenerate("customers and taskgate")
    project.run("alembic", "upgrade", "head")

    assert "op.create_table('taskgate_tasks'" in migration and "drop_table" not in migration
    assert {"customers", "taskgate_tasks", "taskgate_slots"} <= table_names(database_url)
    assert_no_new_operations(project)
    assert_serves_a_broker(database_url)


def test_an_app_migration_over_tables_taskgate_migrate_made_adds_only_the_apps_tables(
    database_url: str, tmp_path: Path
) -> None:
    project = app_project(tmp_path / "app", database_url)
    project.run("taskgate-migrate", "upgrade", database_url)

    migration = project.autogenerate("customers")
    project.run("alembic", "upgrade", "head")

    assert "op.create_table('customers'" in migration
    assert "taskgate_" not in migration  # neither its tables to create nor its version table to drop
    assert_no_new_operations(project)
    assert_serves_a_broker(database_url)


def test_an_app_that_does_not_mount_the_tables_leaves_taskgates_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    make_tables(url)  # taskgate made its tables on first use
    project = app_project(tmp_path / "app", url, mount=False)

    migration = project.autogenerate("customers")
    project.run("alembic", "upgrade", "head")

    assert "op.create_table('customers'" in migration and "taskgate_" not in migration
    assert_no_new_operations(project)
    assert_serves_a_broker(url)


@pytest.mark.parametrize("mount", [True, False])
def test_without_include_object_autogenerate_would_drop_taskgates_tables(tmp_path: Path, mount: bool) -> None:
    """What `include_object` is for: the same project without it proposes the drops."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    make_tables(url)
    project = app_project(tmp_path / "app", url, mount=mount)
    env = project.root / "migrations" / "env.py"
    env.write_text(env.read_text().replace(f", {HOOK}", ""))

    migration = project.autogenerate("customers")

    assert "op.drop_table('taskgate_alembic_version')" in migration
    assert ("op.drop_table('taskgate_tasks')" in migration) is not mount
