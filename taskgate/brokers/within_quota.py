"""`claim_within_quota` for brokers that hold one lock or transaction around both steps.

Inside that one atomic unit: take up to ``limit`` units, claim that many tasks at most, and
give back the units no task took -- so the caller sees units spent only for tasks claimed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from taskgate.brokers.base import Lease, QuotaClaim, QuotaGrant

__all__ = ["claim_within_grant"]


def claim_within_grant(
    grant: QuotaGrant, claim: Callable[[int], list[Lease]], release: Callable[[QuotaGrant, int], None]
) -> QuotaClaim:
    """Claim up to ``grant.granted`` tasks, release the units left over; call under one lock/tx."""
    if grant.granted <= 0:
        return QuotaClaim(leases=[], grant=grant, exhausted=True)
    leases = claim(grant.granted)
    if len(leases) < grant.granted:
        release(grant, grant.granted - len(leases))
    return QuotaClaim(leases=leases, grant=dataclasses.replace(grant, granted=len(leases)), exhausted=False)
