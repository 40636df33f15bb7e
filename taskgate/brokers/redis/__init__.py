"""The Redis broker: tasks shared by every process using one Redis, one Lua script per transition.

Every call of a verb is one Lua script in ``lua/`` -- a submit, a claim with the acks, quota
and shared slots and rate it carries, a settle of any mix of ends (completion + wake-ups,
retry, fail/cancel + cascade, requeue) with the capacity it gives back, a heartbeat with its
slot, a cancel, a reap, a replay -- so there is no crash window in which a task left its
queue without a lease, and "parent done, child still blocked" is never observable. All keys
of one broker share a Cluster hash tag (``tg:{tg}:…`` for the default prefix); the key layout,
for inspecting backlogs with ``redis-cli``, is in this package's README.md. Importing it
without redis-py installed raises `ConfigError` naming the extra (``taskgate[redis]``).
"""

from __future__ import annotations

try:
    import redis  # noqa: F401  (the broker's modules use redis-py throughout)
except ImportError as exc:
    from taskgate.brokers.drivers import missing_driver

    raise missing_driver("RedisBroker", "redis", exc) from exc

from taskgate.brokers.redis.broker import RedisBroker

__all__ = ["RedisBroker"]
