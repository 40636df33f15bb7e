"""The one place where driver and SQLAlchemy exceptions become `BrokerError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from taskgate.brokers.sql.engine import is_packet_too_large
from taskgate.brokers.sql.retry import Conflict
from taskgate.errors import BrokerError

__all__ = ["translated"]


@contextmanager
def translated(operation: str) -> Iterator[None]:
    """Let taskgate's own errors (and bad-input errors) through; wrap database failures. A
    statement over MySQL's ``max_allowed_packet`` is a `ValueError`: too big, not a failure.

    The driver's exception stays chained as ``__cause__`` for debugging.
    """
    try:
        yield
    except DBAPIError as exc:
        if is_packet_too_large(exc.orig):
            # Not the store failing: this request is too big for the server, every time it is
            # sent. The server refused the statement and ended its session (the transaction
            # rolled back; the connection is replaced, `engine.closed_if_broken`).
            raise ValueError(
                f"{operation} failed: a statement was larger than this MySQL server's "
                f"max_allowed_packet ({exc.orig}); nothing was stored: send fewer or smaller "
                "values at a time, or raise max_allowed_packet on the server"
            ) from exc
        raise BrokerError(f"{operation} failed: {type(exc.orig).__name__}: {exc.orig}") from exc
    except SQLAlchemyError as exc:
        raise BrokerError(f"{operation} failed: {exc}") from exc
    except Conflict as exc:
        raise BrokerError(f"{operation} kept losing a uniqueness race: {exc}") from exc
