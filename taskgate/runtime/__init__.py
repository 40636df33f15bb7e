"""The runtime behind `taskgate.Gate`: scheduling, limits, quotas, retries, leases and hooks.

Only `renew_lease` and `renew_lease_sync` are meant for applications; the rest is internal
and may change.
"""

from __future__ import annotations

from taskgate.runtime.context import renew_lease, renew_lease_sync

__all__ = ["renew_lease", "renew_lease_sync"]
