"""`include_object`: keep taskgate's own bookkeeping out of an application's alembic autogenerate.

An application that mounts taskgate's tables (`taskgate.models.mount`) lets its own alembic
create and migrate them. Its autogenerate compares the database with its ``MetaData`` and
proposes to drop every table it finds there and not in the ``MetaData``: taskgate's version
table ``<prefix>alembic_version`` (written by ``taskgate-migrate``, or by a broker that created
the tables), and, in an application that does not mount them, all of taskgate's tables. This
filter leaves those out of the comparison; tables in the ``MetaData`` are compared as usual::

    from taskgate.models import include_object

    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)
"""

from __future__ import annotations

from sqlalchemy.schema import SchemaItem

from taskgate.models.build import TABLE_NAMES, prefixes_in_use

__all__ = ["include_object"]

_VERSION_TABLE = "alembic_version"


def include_object(
    obj: SchemaItem, name: str | None, type_: str, reflected: bool, compare_to: SchemaItem | None
) -> bool:
    """alembic's ``include_object`` hook: False for a table of taskgate's found in the database
    but not in the application's ``MetaData``, True for everything else.

    taskgate's tables are ``<prefix><table>`` and ``<prefix>alembic_version`` for the default
    prefix and every prefix this process mounted or opened a broker with.
    """
    if type_ != "table" or not reflected or compare_to is not None or name is None:
        return True
    return not _is_taskgates(name)


def _is_taskgates(name: str) -> bool:
    for prefix in prefixes_in_use():
        if name.startswith(prefix) and name[len(prefix) :] in (*TABLE_NAMES, _VERSION_TABLE):
            return True
    return False
