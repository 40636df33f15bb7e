"""Opening the redis-py clients a `RedisBroker` uses, from a URL or a client the caller owns."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from taskgate.brokers.redis.waiter import SLICE
from taskgate.errors import ConfigError

__all__ = ["Clients", "open_clients"]


@dataclass(frozen=True, slots=True)
class Clients:
    """``main`` runs scripts and commands; ``waits`` serves blocking BLPOPs; ``owned`` by us?"""

    main: Any
    waits: Any
    owned: bool

    def close(self) -> None:
        """Close the clients we opened; a caller's client is the caller's to close."""
        if self.owned:
            self.main.close()
            self.waits.close()


def check_timeout(value: object) -> float:
    """A socket timeout in seconds, finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"RedisBroker socket_timeout must be a number of seconds, got {value!r}")
    if value <= 0:
        raise ConfigError(f"RedisBroker socket_timeout must be > 0 seconds, got {value!r}")
    return float(value)


def _from_url(url: str, socket_timeout: float, read_slack: float = 0.0) -> Any:
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No automatic retries: a script that timed out may have run, and running it again could
    # apply a transition twice. The caller (Gate) decides; leases make that safe.
    return Redis.from_url(
        url,
        socket_timeout=socket_timeout + read_slack,
        socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
    )


def _check_client(client: Any) -> Any:
    get_encoder = getattr(client, "get_encoder", None)
    if get_encoder is None or not hasattr(client, "fcall"):
        raise ConfigError(
            f"RedisBroker needs a redis URL or a redis-py Redis/RedisCluster client, got {client!r}"
        )
    if get_encoder().decode_responses:
        raise ConfigError("RedisBroker needs a client with decode_responses=False (payloads are bytes)")
    return client


def open_clients(url_or_client: object, socket_timeout: float) -> Clients:
    """Clients for a URL (two pools of our own) or for a caller's client (shared by both)."""
    if isinstance(url_or_client, str):
        if "://" not in url_or_client:
            raise ConfigError(f"RedisBroker needs a URL such as 'redis://host:6379/0', got {url_or_client!r}")
        # Blocking waits get their own pool; a read may take one BLPOP slice longer.
        waits = _from_url(url_or_client, socket_timeout, read_slack=SLICE)
        return Clients(main=_from_url(url_or_client, socket_timeout), waits=waits, owned=True)
    client = _check_client(url_or_client)
    return Clients(main=client, waits=client, owned=False)
