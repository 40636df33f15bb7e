"""Pure runtime policy: backoff window, token bucket arithmetic, and the retry decision."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from taskgate import SkipRetry, Status, Task, Throttled
from taskgate.brokers.base import FailureKind
from taskgate.brokers.checks import MAX_ERROR_LENGTH, storable_error
from taskgate.runtime.backoff import BACKOFF_CAP, backoff_bounds, business_backoff, exponential
from taskgate.runtime.bucket import TokenBucket
from taskgate.runtime.outcome import Fail, Retry, decide, describe, unknown_type

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _task(**fields: object) -> Task:
    base: dict[str, object] = {
        "id": "01TASK",
        "type": "t",
        "queue": "q",
        "payload": None,
        "status": Status.RUNNING,
        "created_at": NOW,
        "run_at": NOW,
    }
    base.update(fields)
    return Task(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attempts", "center"), [(1, 2.0), (2, 4.0), (3, 8.0), (9, 512.0), (10, 600.0), (500, 600.0)]
)
def test_backoff_doubles_per_attempt_capped_at_ten_minutes(attempts, center):
    assert exponential(attempts) == center
    assert backoff_bounds(attempts) == pytest.approx((center * 0.8, center * 1.2))


def test_backoff_jitter_spans_exactly_plus_minus_twenty_percent():
    assert business_backoff(3, rand=lambda: 0.0) == pytest.approx(6.4)
    assert business_backoff(3, rand=lambda: 0.5) == pytest.approx(8.0)
    assert business_backoff(3, rand=lambda: 0.999999) == pytest.approx(9.6, rel=1e-5)
    assert business_backoff(100, rand=lambda: 0.999999) <= BACKOFF_CAP * 1.2


def test_bucket_starts_full_then_refills_at_rps():
    bucket = TokenBucket(rps=5, burst=0, now=0.0)  # burst 0 -> max(1, int(rps)) = 5
    assert bucket.available(0.0, 10) == 5
    bucket.take(0.0, 5)
    assert bucket.available(0.0, 10) == 0
    assert bucket.wait_time(0.0) == pytest.approx(0.2)
    assert bucket.available(0.2, 10) == 1
    assert bucket.available(100.0, 10) == 5  # never more than the bucket holds


def test_bucket_burst_rules_and_unlimited():
    assert TokenBucket(rps=0.5, burst=0, now=0).capacity == 1
    assert TokenBucket(rps=3, burst=7, now=0).capacity == 7
    unlimited = TokenBucket(rps=0, burst=0, now=0)
    assert unlimited.available(0, 1000) == 1000 and unlimited.wait_time(0) == 0
    with pytest.raises(ValueError, match="rps"):
        TokenBucket(rps=-1, burst=0, now=0)


def test_a_business_failure_retries_while_attempts_stay_within_max_retry():
    outcome = decide(ValueError("bad"), _task(attempts=0, max_retry=1), throttled_max=10, rand=lambda: 0.5)
    assert outcome == Retry(FailureKind.BUSINESS, "ValueError: bad", 2.0)
    final = decide(ValueError("bad"), _task(attempts=1, max_retry=1), throttled_max=10)
    assert final == Fail(FailureKind.BUSINESS, "ValueError: bad")


def test_throttled_retries_after_its_delay_until_throttled_max():
    exc = Throttled(retry_after=7)
    assert decide(exc, _task(throttled=1), throttled_max=2) == Retry(
        FailureKind.THROTTLED, "Throttled: throttled", 7.0
    )
    assert decide(exc, _task(throttled=2), throttled_max=2) == Fail(
        FailureKind.THROTTLED, "Throttled: throttled"
    )


def test_a_queue_wide_throttle_retries_holding_the_queue_until_its_retry_after_is_spent():
    exc = Throttled(retry_after=7, scope="queue")
    assert decide(exc, _task(throttled=1), throttled_max=2) == Retry(
        FailureKind.THROTTLED, "Throttled: throttled", 7.0, hold_queue=True
    )
    assert decide(exc, _task(throttled=2), throttled_max=2) == Fail(
        FailureKind.THROTTLED, "Throttled: throttled"
    )


def test_a_throttle_whose_scope_was_changed_to_an_unknown_one_fails_as_a_business_failure():
    exc = Throttled(retry_after=1, scope="queue")
    exc.scope = "everything"
    outcome = decide(exc, _task(max_retry=0), throttled_max=10)
    assert isinstance(outcome, Fail) and outcome.kind is FailureKind.BUSINESS
    assert "'everything'" in outcome.error


def test_skip_retry_and_unknown_type_fail_at_once():
    assert decide(SkipRetry("no"), _task(max_retry=9), throttled_max=1) == Fail(
        FailureKind.SKIP, "SkipRetry: no"
    )
    outcome = unknown_type(_task(type="mystery"))
    assert outcome.kind is FailureKind.SKIP and outcome.error.startswith("UnknownTypeError: ")
    assert "mystery" in outcome.error


def test_describe_names_the_exception_type():
    assert describe(KeyError("k")) == "KeyError: 'k'"
    assert describe(RuntimeError()) == "RuntimeError"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_describe_of_an_exception_whose_str_raises_names_both():
    assert describe(_Unprintable()) == "_Unprintable: <str() of the exception raised RuntimeError>"


def test_describe_makes_the_text_storable_on_every_backend():
    assert describe(OSError("bad\x00name \udcff.txt")) == "OSError: bad\\x00name \\udcff.txt"
    long = describe(ValueError("v" * 100_000))
    assert len(long) == MAX_ERROR_LENGTH and long.endswith("[cut from 100012 characters]")


def test_storable_error_leaves_a_storable_text_as_it_is():
    for text in ["plain", "caf\u00e9 \U0001f600", "escaped already: \\x00 \\udcff", "w" * MAX_ERROR_LENGTH]:
        assert storable_error(text) == text
    once = storable_error("x\x00" * MAX_ERROR_LENGTH)
    assert storable_error(once) == once


def test_a_throttled_whose_retry_after_was_changed_to_a_bad_value_is_a_business_failure():
    exc = Throttled(retry_after=1)
    exc.retry_after = math.inf
    outcome = decide(exc, _task(max_retry=0), throttled_max=10)
    assert isinstance(outcome, Fail) and outcome.kind is FailureKind.BUSINESS
    assert outcome.error.startswith("ValueError: retry_after must be from 0 to 2592000 seconds")
