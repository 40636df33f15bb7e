"""The runtime behind `taskgate.Gate`: scheduling, limits, quotas, retries, leases and hooks.

Only `renew_lease`, `renew_lease_sync`, `set_progress`, `set_progress_sync`, `step` and
`step_sync` are meant for applications; the rest is internal and may change.
"""

from __future__ import annotations

from taskgate.runtime.context import renew_lease, renew_lease_sync
from taskgate.runtime.progress import set_progress, set_progress_sync
from taskgate.runtime.steps import step, step_sync

__all__ = ["renew_lease", "renew_lease_sync", "set_progress", "set_progress_sync", "step", "step_sync"]
