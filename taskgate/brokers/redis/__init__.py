"""The Redis broker: tasks shared by every process using one Redis, one Lua script per transition.

Every multi-step transition (enqueue, claim, ack + wake-up, retry, fail/cancel + cascade,
requeue, heartbeat, reap, replay, quota, slots, rate) is one Lua script in ``lua/``, so there is
no crash window in which a task left its queue without a lease, and "parent done, child still
blocked" is never observable. All keys of one broker share a Cluster hash tag
(``tg:{tg}:…`` for the default prefix); the key layout, for inspecting backlogs with
``redis-cli``, is in this package's README.md.
"""

from __future__ import annotations

from taskgate.brokers.redis.broker import RedisBroker

__all__ = ["RedisBroker"]
