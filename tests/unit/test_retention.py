"""`Retention` checks its values, and `retention_plan` turns a config into few prunes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskgate import Config, ConfigError, QueueConfig, Retention, Status
from taskgate.brokers.memory import MemoryBroker
from taskgate.brokers.params import Prune
from taskgate.runtime.retention import PRUNE_BATCH, retention_plan

DAY = timedelta(days=1)


def test_the_defaults_keep_completed_and_canceled_a_week_and_failed_a_month() -> None:
    kept = Retention()
    assert (kept.completed, kept.canceled, kept.failed) == (7 * DAY, 7 * DAY, 30 * DAY)
    assert Config(broker=MemoryBroker()).retention == kept
    assert kept.keep(Status.FAILED) == 30 * DAY


def test_none_keeps_forever_and_durations_take_every_usual_form() -> None:
    kept = Retention(completed=None, canceled=3600, failed=timedelta(hours=2))
    assert (kept.completed, kept.canceled, kept.failed) == (None, timedelta(hours=1), timedelta(hours=2))
    assert Retention(completed="1h30m").completed == timedelta(minutes=90)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("completed", "-1d", "Retention.completed must be >= 0"),
        ("failed", -5, "Retention.failed must be >= 0"),
        ("canceled", "a week", "Retention.canceled: cannot read 'a week'"),
        ("completed", [7], "Retention.completed: expected a duration"),
        ("failed", "99999d", "Retention.failed must be at most"),
    ],
)
def test_a_bad_retention_names_its_field(field: str, value: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Retention(**{field: value})  # type: ignore[arg-type]


def test_config_and_queue_config_take_a_retention_or_a_mapping_of_one() -> None:
    queue = QueueConfig(workers=1, retention={"completed": "1h"})  # type: ignore[arg-type]
    assert queue.retention == Retention(completed="1h")
    with pytest.raises(ConfigError, match=r"QueueConfig.retention must be a Retention"):
        QueueConfig(workers=1, retention="7d")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Config.retention must be a Retention"):
        Config(broker=MemoryBroker(), retention=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown key\(s\) pending"):
        Config(broker=MemoryBroker(), retention={"pending": "1d"})  # type: ignore[arg-type]
    loaded = Config.from_mapping(
        {"queues": {"q": {"workers": 1, "retention": {"failed": None}}}, "retention": {"completed": "1d"}},
        broker=MemoryBroker(),
    )
    assert loaded.retention.completed == DAY and loaded.queues["q"].retention == Retention(failed=None)


def _plan(**options: object) -> set[Prune]:
    return set(retention_plan(Config(broker=MemoryBroker(), **options)))  # type: ignore[arg-type]


def test_the_default_plan_is_two_prunes_of_the_named_queues() -> None:
    queues = {"a": QueueConfig(workers=1), "b": QueueConfig(workers=1)}
    assert _plan(queues=queues) == {
        Prune((Status.COMPLETED, Status.CANCELED), older_than=7 * DAY, queues=("a", "b"), limit=PRUNE_BATCH),
        Prune((Status.FAILED,), older_than=30 * DAY, queues=("a", "b"), limit=PRUNE_BATCH),
    }


def test_a_queue_of_its_own_retention_gets_its_own_prune_and_none_keeps_forever() -> None:
    queues = {
        "a": QueueConfig(workers=1),
        "b": QueueConfig(workers=1, retention=Retention(completed="1h", failed=None)),
    }
    assert _plan(queues=queues) == {
        Prune((Status.COMPLETED,), older_than=7 * DAY, queues=("a",), limit=PRUNE_BATCH),
        Prune((Status.CANCELED,), older_than=7 * DAY, queues=("a", "b"), limit=PRUNE_BATCH),
        Prune((Status.COMPLETED,), older_than=timedelta(hours=1), queues=("b",), limit=PRUNE_BATCH),
        Prune((Status.FAILED,), older_than=30 * DAY, queues=("a",), limit=PRUNE_BATCH),
    }


def test_a_default_queue_prunes_every_queue_but_those_of_another_retention() -> None:
    queues = {"a": QueueConfig(workers=1), "b": QueueConfig(workers=1, retention=Retention(completed=None))}
    plan = _plan(queues=queues, default_queue=QueueConfig(workers=1), retention=Retention(failed=None))
    assert plan == {
        Prune((Status.COMPLETED,), older_than=7 * DAY, exclude_queues=("b",), limit=PRUNE_BATCH),
        Prune((Status.CANCELED,), older_than=7 * DAY, limit=PRUNE_BATCH),
        Prune((Status.FAILED,), older_than=30 * DAY, queues=("b",), limit=PRUNE_BATCH),
    }


def test_keeping_everything_forever_plans_nothing() -> None:
    forever = Retention(completed=None, canceled=None, failed=None)
    assert _plan(queues={"a": QueueConfig(workers=1)}, retention=forever) == set()
