"""`taskgate.dashboard.app`'s arguments, and the message when its extra is missing."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from taskgate import Config, QueueConfig, dashboard
from taskgate.brokers.memory import MemoryBroker


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"allow_actions": "yes"}, TypeError),
        ({"auth": "admin"}, TypeError),
        ({"queues": {"cpu": 4}}, TypeError),
        ({"secret": b"short"}, ValueError),
        ({"refresh": 0}, ValueError),
    ],
)
def test_a_bad_argument_is_refused_naming_it(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(options)).split("_")[0]):
        dashboard.app(MemoryBroker(), **options)


def test_queues_may_be_a_config_or_a_mapping() -> None:
    broker = MemoryBroker()
    dashboard.app(broker, queues=Config(broker=broker, queues={"cpu": QueueConfig(workers=1)}))
    dashboard.app(broker, queues={"cpu": QueueConfig(workers=1)}, secret=b"s" * 32)


def test_without_the_extra_importing_it_names_the_extra_to_install() -> None:
    code = "import sys; sys.modules['starlette'] = None; import taskgate.dashboard"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "ConfigError" in done.stderr and "pip install 'taskgate[dashboard]'" in done.stderr
