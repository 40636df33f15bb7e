"""The SQL broker: one implementation for SQLite, PostgreSQL (psycopg 3) and MySQL/MariaDB (PyMySQL)."""

from __future__ import annotations

from taskgate.brokers.sql.broker import SQLBroker
from taskgate.brokers.sql.schema import SchemaError

__all__ = ["SQLBroker", "SchemaError"]
