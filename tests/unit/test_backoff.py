"""`Backoff` and the per-type retry decision (`retry_if`), as pure values."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from taskgate import Backoff, ConfigError, QueueConfig, SkipRetry, Status, Task, Throttled
from taskgate.brokers.base import FailureKind
from taskgate.runtime.backoff import backoff_bounds
from taskgate.runtime.outcome import Fail, Policy, Retry, decide

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _task(**fields: object) -> Task:
    base: dict[str, object] = {"id": "01TASK", "type": "t", "queue": "q", "payload": None}
    base.update(status=Status.RUNNING, created_at=NOW, run_at=NOW, max_retry=3, **fields)
    return Task(**base)  # type: ignore[arg-type]


def test_the_default_backoff_is_taskgates_own_formula() -> None:
    for failures in (1, 2, 3, 9, 10, 500, 5000):
        assert Backoff().bounds(failures) == backoff_bounds(failures)


def test_a_backoff_waits_base_times_factor_to_the_failures_up_to_max_within_its_jitter() -> None:
    backoff = Backoff(base="10s", factor=3, max="5m", jitter=0.5)

    assert backoff.base == timedelta(seconds=10) and backoff.max == timedelta(minutes=5)
    assert backoff.bounds(1) == (15.0, 45.0)
    assert backoff.bounds(2) == (45.0, 135.0)
    assert backoff.bounds(4) == (150.0, 450.0)  # 810 s capped at 5 min
    assert backoff.delay(1, rand=lambda: 0.0) == 15.0
    assert backoff.delay(1, rand=lambda: 0.5) == 30.0


def test_a_backoff_without_jitter_or_growth_waits_the_same_every_time() -> None:
    steady = Backoff(base=7, factor=1, jitter=0)
    assert [steady.delay(n) for n in (1, 2, 50)] == [7.0, 7.0, 7.0]


def test_a_huge_factor_is_capped_not_overflowed() -> None:
    assert Backoff(factor=1e300, max="1h").bounds(10_000) == (2880.0, 4320.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base": 0}, "Backoff.base must be > 0, got 0"),
        ({"base": "-1s"}, r"Backoff.base must be > 0, got '-1s'"),
        ({"base": "soon"}, r"Backoff.base: cannot read 'soon' as a duration"),
        ({"max": "0s"}, r"Backoff.max must be > 0, got '0s'"),
        ({"factor": 0}, "Backoff.factor must be > 0, got 0"),
        ({"factor": -2}, "Backoff.factor must be > 0, got -2"),
        ({"factor": float("nan")}, "Backoff.factor must be a finite number, got nan"),
        ({"factor": True}, "Backoff.factor must be a finite number, got True"),
        ({"jitter": 1}, r"Backoff.jitter must be in \[0, 1\), got 1"),
        ({"jitter": -0.1}, r"Backoff.jitter must be in \[0, 1\), got -0.1"),
        ({"jitter": "0.2"}, "Backoff.jitter must be a finite number, got '0.2'"),
    ],
)
def test_a_bad_backoff_raises_config_error_naming_the_value(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Backoff(**options)  # type: ignore[arg-type]


def test_a_queue_takes_a_backoff_or_its_mapping_and_refuses_anything_else() -> None:
    from_yaml = QueueConfig(workers=1, backoff={"base": "2s", "jitter": 0})  # type: ignore[arg-type]
    assert from_yaml.backoff == Backoff(base="2s", jitter=0)
    with pytest.raises(ConfigError, match=r"QueueConfig.backoff must be a taskgate.Backoff or None, got 5"):
        QueueConfig(workers=1, backoff=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"QueueConfig.backoff: .*'bse'"):
        QueueConfig(workers=1, backoff={"bse": "2s"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Backoff.jitter must be in"):
        QueueConfig.from_mapping({"workers": 1, "backoff": {"jitter": 2}})


def test_retry_if_false_fails_at_once_and_true_retries_after_the_policys_backoff() -> None:
    policy = Policy(Backoff(base="10s", jitter=0), retry_if=lambda exc: isinstance(exc, ConnectionError))

    assert decide(ValueError("bad"), _task(), throttled_max=5, policy=policy) == Fail(
        FailureKind.BUSINESS, "ValueError: bad"
    )
    assert decide(ConnectionError("flaky"), _task(attempts=1), throttled_max=5, policy=policy) == Retry(
        FailureKind.BUSINESS, "ConnectionError: flaky", 40.0
    )


def test_retry_if_is_not_asked_once_the_retries_are_spent() -> None:
    asked: list[Exception] = []
    policy = Policy(retry_if=lambda exc: asked.append(exc) or True)

    assert isinstance(decide(ValueError("x"), _task(attempts=3), throttled_max=5, policy=policy), Fail)
    assert asked == []


def test_a_retry_if_that_raises_means_no_retry_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def broken(exc: Exception) -> bool:
        raise KeyError("oops")

    with caplog.at_level(logging.ERROR, logger="taskgate"):
        outcome = decide(ValueError("bad"), _task(), throttled_max=5, policy=Policy(retry_if=broken))

    assert outcome == Fail(FailureKind.BUSINESS, "ValueError: bad")
    (record,) = caplog.records
    assert "retry_if raised on ValueError: bad" in record.getMessage() and record.exc_info is not None


def test_throttled_and_skip_retry_never_reach_retry_if() -> None:
    def never(exc: Exception) -> bool:
        raise AssertionError("asked")

    policy = Policy(retry_if=never)
    assert isinstance(decide(Throttled(retry_after=5), _task(), throttled_max=5, policy=policy), Retry)
    assert isinstance(decide(SkipRetry("no"), _task(), throttled_max=5, policy=policy), Fail)
