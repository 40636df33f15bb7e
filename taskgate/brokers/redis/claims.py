"""A `Claim` as one script call: which script runs it, its arguments, and its reply as `Claimed`.

A claim runs ``claim.lua``; with a quota ``claim_quota.lua``; with shared limits (and a quota
and group limits, if any) ``claim_limited.lua``. Acks it carries make it the chained form of the same script
(``ack_many.lua`` in quiet mode first, see ``lua/_chain.lua``): one ``FCALL`` whatever the claim
carries, so slots, starts and quota units are spent only for tasks claimed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from taskgate.brokers.base import Lease, QuotaGrant, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, ItemAnswer, SharedLimits
from taskgate.brokers.redis.acks import ack_args, quiet_answer
from taskgate.brokers.redis.codec import from_us, hold_from, lease_from_values, ttl_us
from taskgate.brokers.redis.replies import unwrap
from taskgate.errors import BrokerError
from taskgate.ids import new_tokens

__all__ = ["claim_call"]

# A claim script's values after "ok", and the acks' answers, as the claim's answer.
Reading = Callable[[Sequence[Any], list[ItemAnswer]], Claimed]

# The chained script of each claim script: quiet acks first, then the claim.
_AFTER_ACKS = {"claim": "ack_claim", "claim_quota": "ack_claim_quota", "claim_limited": "ack_claim_limited"}


def claim_call(claim: Claim) -> tuple[str, list[Any], Callable[[list[Any]], Claimed]]:
    """The call of ``claim``: the script (its own, or the chained form when it carries acks),
    its arguments after "now", and the claim's answer from the script's whole reply."""
    script, args, reading = _claim_part(claim)
    if not claim.acks:
        return script, args, lambda reply: _held(reply, []) or reading(unwrap(reply), [])
    acks = ack_args("quiet", claim.acks)
    chain = _AFTER_ACKS[script]

    def answer(reply: list[Any]) -> Claimed:
        acked, *claim_reply = reply
        answers = [quiet_answer(item) for item in unwrap(acked)]
        (claim_values,) = claim_reply  # the acks part answered "ok": the claim part ran
        held = _held(claim_values, answers)
        if held is not None:
            return held
        if claim_values[0] != b"ok":
            # The acks are written: the claim's failure is answered, not raised.
            failure = BrokerError(f"Redis script {chain} failed in its claim part: {_text(claim_values[1:])}")
            return Claimed(leases=[], acked=answers, failed=failure)
        return reading(unwrap(claim_values), answers)

    return chain, [len(acks), *acks, *args], answer


def _held(reply: Sequence[Any], acked: list[ItemAnswer]) -> Claimed | None:
    """The answer of a claim script that found its queue held (``{"held", until}``), else None."""
    if reply[0] != b"held":
        return None
    return Claimed(leases=[], acked=acked, held_until=hold_from(reply[1]))


def _claim_part(claim: Claim) -> tuple[str, list[Any], Reading]:
    tokens = new_tokens(claim.limit)
    ttl = ttl_us(claim.lease_ttl)
    if claim.shared is not None:
        return "claim_limited", _limited_args(claim, claim.shared, ttl, tokens), _limited_reading(claim.quota)
    if claim.quota is not None:
        quota = claim.quota
        args = [claim.queue, ttl, quota.key, quota.limit, ttl_us(quota.period), _types(claim), *tokens]
        return "claim_quota", args, _quota_reading(quota)
    return "claim", [claim.queue, ttl, _types(claim), *tokens], _plain_reading


def _types(claim: Claim) -> str:
    """`Claim.types` as the claim scripts take them: NUL-separated (no type holds a NUL), ""
    for any type."""
    return "" if claim.types is None else "\0".join(claim.types)


def _plain_reading(values: Sequence[Any], acked: list[ItemAnswer]) -> Claimed:
    return Claimed(leases=[lease_from_values(snapshot) for snapshot in values], acked=acked)


def _quota_reading(quota: QuotaSpec) -> Reading:
    def reading(values: Sequence[Any], acked: list[ItemAnswer]) -> Claimed:
        start_us, left, *snapshots = values
        leases = [lease_from_values(snapshot) for snapshot in snapshots]
        return Claimed(
            leases=leases, acked=acked, quota=_grant(quota, start_us, leases), exhausted=int(left) <= 0
        )

    return reading


def _limited_args(claim: Claim, shared: SharedLimits, ttl: int, tokens: list[str]) -> list[Any]:
    rps, burst = _rate(shared)
    quota = claim.quota
    quota_args = ["", 0, 0] if quota is None else [quota.key, quota.limit, ttl_us(quota.period)]
    return [
        claim.queue,
        shared.workers,
        ttl,
        repr(rps),
        burst,
        *quota_args,
        shared.claimer,
        _types(claim),
        _group_limits(shared),
        len(shared.release),
        *shared.release,
        *tokens,
    ]


def _group_limits(shared: SharedLimits) -> str:
    """The group limits as ``claim_limited.lua`` takes them: "" for none (the claim then runs
    no group code), else "workers rps burst quota period_us", 0 where unset."""
    if not shared.grouped:
        return ""
    period = shared.group_quota_period
    values = (
        shared.group_workers,
        repr(float(shared.group_rps)),
        shared.group_burst,
        shared.group_quota_limit,
        0 if period is None else ttl_us(period),
    )
    return " ".join(map(str, values))


def _rate(shared: SharedLimits) -> tuple[float, int]:
    """The rate as ``claim_limited.lua`` takes it: ``burst=0`` made ``max(1, int(rps))``."""
    return float(shared.rps), shared.burst or max(1, int(shared.rps))


def _limited_reading(quota: QuotaSpec | None) -> Reading:
    def reading(values: Sequence[Any], acked: list[ItemAnswer]) -> Claimed:
        retry_after, start_us, left, *snapshots = values
        leases = [lease_from_values(snapshot) for snapshot in snapshots]
        if quota is None:
            return Claimed(leases=leases, acked=acked, retry_after=float(retry_after))
        return Claimed(
            leases=leases,
            acked=acked,
            quota=_grant(quota, start_us, leases),
            exhausted=int(left) <= 0,
            retry_after=float(retry_after),
        )

    return reading


def _grant(quota: QuotaSpec, start_us: Any, leases: list[Lease]) -> QuotaGrant:
    """The units the leases took from the window starting at ``start_us``: one each."""
    start = from_us(start_us)
    return QuotaGrant(
        key=quota.key,
        window_start=start,
        window_end=start + quota.period,
        granted=len(leases),
        limit=quota.limit,
    )


def _text(values: Sequence[Any]) -> str:
    """What a chained script's failed part answered after ``"failed"``, as text."""
    return " ".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in values)
