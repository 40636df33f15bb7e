"""`taskgate migrate …` (and its alias `taskgate-migrate`): taskgate's alembic migrations, saying
what they did -- the revision before and after, or the SQL with ``--sql``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TextIO

from taskgate.cli.errors import CLIError
from taskgate.cli.store import store_family

__all__ = ["add_arguments", "run"]


def add_arguments(
    parser: argparse.ArgumentParser,
    *,
    url_required: bool,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> None:
    """The ``upgrade|downgrade|current|history`` subcommands on ``parser``, each also taking the
    options of ``parents``."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return actions.add_parser(name, help=help, description=help, parents=list(parents))

    up = add("upgrade", "migrate up (default: to head)")
    down = add("downgrade", "migrate down to a revision ('base' drops every table)")
    current = add("current", "show the database's revision")
    add("history", "list the revisions")
    for sub in (up, down, current):
        if url_required:
            sub.add_argument("url", help="database URL, e.g. postgresql://user@host/db")
            sub.add_argument("--prefix", help="table prefix (default: taskgate_)")
        else:
            sub.add_argument("url", nargs="?", help="database URL (default: --url / TASKGATE_URL)")
    up.add_argument("--revision", default="head", help="the revision to reach (default: head)")
    down.add_argument("revision", help="the revision to reach ('base': none)")
    for sub in (up, down):
        sub.add_argument("--sql", action="store_true", help="print the SQL instead of running it")


# alembic and the SQL layer are imported when a migration runs: every other command starts faster.


def _revision(url: str, prefix: str) -> str:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    from taskgate.brokers.sql.engine import normalize_url

    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": f"{prefix}alembic_version"}
            )
            return context.get_current_revision() or "nothing"
    finally:
        engine.dispose()


def run(args: argparse.Namespace, out: TextIO) -> None:
    """Carry out ``args.action`` and report it on ``out``."""
    from alembic import command

    from taskgate.brokers.sql.engine import normalize_url
    from taskgate.migrate import alembic_config, downgrade, upgrade
    from taskgate.models import DEFAULT_PREFIX

    if args.action == "history":
        command.history(alembic_config())
        return
    url = args.url or args.store_url
    if not url:
        raise CLIError("no database: give its URL, or pass --url or set TASKGATE_URL")
    if store_family(url) != "sql":
        raise CLIError(f"migrations are for SQL stores; {url.split(':', 1)[0]} keeps no schema to migrate")
    prefix = args.prefix or DEFAULT_PREFIX
    if args.action == "current":
        out.write(f"{_revision(url, prefix)}\n")
        return
    if args.sql:
        (upgrade if args.action == "upgrade" else downgrade)(url, args.revision, prefix=prefix, sql=True)
        return
    before = _revision(url, prefix)
    (upgrade if args.action == "upgrade" else downgrade)(url, args.revision, prefix=prefix)
    after = _revision(url, prefix)
    shown = normalize_url(url).render_as_string(hide_password=True)
    verb = "upgraded" if args.action == "upgrade" else "downgraded"
    did = f"{verb} from {before} to {after}" if before != after else f"already at {after}"
    out.write(f"{shown} (prefix {prefix}): {did}\n")
