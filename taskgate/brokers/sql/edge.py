"""The one place where driver and SQLAlchemy exceptions become `BrokerError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from taskgate.brokers.sql.retry import Conflict
from taskgate.errors import BrokerError

__all__ = ["translated"]


@contextmanager
def translated(operation: str) -> Iterator[None]:
    """Let taskgate's own errors (and bad-input errors) through; wrap database failures.

    The driver's exception stays chained as ``__cause__`` for debugging.
    """
    try:
        yield
    except DBAPIError as exc:
        raise BrokerError(f"{operation} failed: {type(exc.orig).__name__}: {exc.orig}") from exc
    except SQLAlchemyError as exc:
        raise BrokerError(f"{operation} failed: {exc}") from exc
    except Conflict as exc:
        raise BrokerError(f"{operation} kept losing a uniqueness race: {exc}") from exc
