"""The Redis key layout of one broker: a validated prefix and the hash-tagged base under it.

Every key of a broker is ``<base><suffix>`` with ``base = "<prefix>{<tag>}:"`` and ``tag`` the
prefix without its trailing colons (prefix ``tg:`` gives base ``tg:{tg}:``, keys such as
``tg:{tg}:task:01J…``). The ``{tag}`` is a Redis Cluster hash tag: every key of a broker lives
in one slot, so each Lua script may touch all of them. Scripts get the base as ``KEYS[1]``
(which routes the call to the slot's node) and derive the other keys from it. The full layout
is listed in ``lua/_lib.lua`` and in this package's README.
"""

from __future__ import annotations

import re

from taskgate.errors import ConfigError

__all__ = ["DEFAULT_PREFIX", "KeySpace"]

DEFAULT_PREFIX = "tg:"

# Identifier-like only: the prefix ends up in key names and must never close the hash tag.
_PREFIX_RE = re.compile(r"[A-Za-z0-9_:.-]{1,64}")


class KeySpace:
    """The keys of one broker under ``prefix``; raises `ConfigError` for an unusable prefix."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
            raise ConfigError(
                f"RedisBroker key_prefix must be 1-64 characters of A-Z a-z 0-9 _ : . -, got {prefix!r}"
            )
        tag = prefix.rstrip(":")
        if not tag:
            raise ConfigError(f"RedisBroker key_prefix needs a character other than ':', got {prefix!r}")
        self.prefix = prefix
        self.base = f"{prefix}{{{tag}}}:"

    def __repr__(self) -> str:
        return f"KeySpace({self.prefix!r})"

    def task(self, task_id: str) -> str:
        """HASH of one execution."""
        return f"{self.base}task:{task_id}"

    def stats(self) -> str:
        """HASH ``"<status>:<type>" -> count``."""
        return f"{self.base}stats"

    def queue(self, queue: str) -> str:
        """ZSET of a queue's pending and retrying ids, scored by run_at (µs)."""
        return f"{self.base}queue:{queue}"

    def signal(self, queue: str) -> str:
        """LIST of wake-up tokens that `wait_for_work` blocks on."""
        return f"{self.base}signal:{queue}"

    def slots(self, queue: str) -> str:
        """ZSET of a queue's concurrency slots, token -> expiry (µs)."""
        return f"{self.base}slots:{queue}"

    def slot_groups(self, queue: str) -> str:
        """HASH of a queue's slot tokens -> group, for the slots of grouped tasks."""
        return f"{self.base}slot_groups:{queue}"

    def pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for every key of this broker (for operators and tests)."""
        escaped = re.sub(r"([\[\]*?\\{}])", r"\\\1", self.base)
        return f"{escaped}*"
