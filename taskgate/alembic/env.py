"""alembic environment of taskgate's migrations.

Settings, first found wins:
- URL: ``-x url=…``, the ``taskgate_url`` attribute (`taskgate.migrate`), the environment
  variable ``TASKGATE_DATABASE_URL``, ``sqlalchemy.url`` of the ini file. A ready connection
  can be passed as the ``connection`` attribute instead.
- table prefix: ``-x prefix=…``, the ``taskgate_prefix`` attribute, else ``taskgate_``.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from taskgate.alembic import PREFIX_OPTION
from taskgate.brokers.sql.engine import normalize_url
from taskgate.models import DEFAULT_PREFIX, Models, check_prefix, models_for

config = context.config
_x = context.get_x_argument(as_dictionary=True)


def _url() -> str:
    url = (
        _x.get("url")
        or config.attributes.get("taskgate_url")
        or os.environ.get("TASKGATE_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit("no database URL: pass `-x url=...` or set TASKGATE_DATABASE_URL")
    return normalize_url(url).render_as_string(hide_password=False)


def _models() -> Models:
    prefix = _x.get("prefix") or config.attributes.get(PREFIX_OPTION) or DEFAULT_PREFIX
    return models_for(check_prefix(prefix))


def _options(models: Models) -> dict[str, Any]:
    """What both modes configure: our tables only, our version table, the prefix for scripts."""
    names = {t.name for t in models.tables}

    def include_name(name: str | None, type_: str, parent_names: object) -> bool:
        # Live next to an application's tables without ever proposing to drop them.
        return type_ != "table" or name in names

    return {
        "target_metadata": models.metadata,
        "version_table": f"{models.prefix}alembic_version",
        "include_name": include_name,
        "compare_type": True,
        PREFIX_OPTION: models.prefix,
    }


def _run_online(connection: Connection, models: Models) -> None:
    context.configure(
        connection=connection,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        **_options(models),
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    """Run the migrations offline (emit SQL) or online (on a connection)."""
    if config.config_file_name is not None and config.attributes.get("configure_logger", True):
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    models = _models()
    if context.is_offline_mode():
        context.configure(url=_url(), literal_binds=True, **_options(models))
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_online(connection, models)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run_online(conn, models)
    finally:
        engine.dispose()


main()
