"""taskgate's pytest plugin: its fixtures, used as an application's tests use them.

The fixtures come from the installed package's ``pytest11`` entry point, not from a conftest:
the first tests here use them as any test of an app does, the last runs pytest on a test file
in a directory with no conftest at all.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from helpers.readme import readme_block

from taskgate import Config, Gate, ManualClock, QueueConfig, Status, Task
from taskgate.brokers.memory import MemoryBroker
from taskgate.testing import drain


@pytest.mark.anyio
async def test_an_apps_retrying_handler_finishes_at_once_on_the_plugins_fixtures(
    memory_broker: MemoryBroker, taskgate_clock: ManualClock
) -> None:
    gate = Gate(
        Config(
            broker=memory_broker,
            queues={"emails": QueueConfig(workers=1)},
            routes={"send_email": "emails"},
            max_retry=3,
        )
    )
    sent: list[int] = []

    @gate.handler("send_email")
    def send_email(task: Task) -> None:
        sent.append(task.attempts)
        if task.attempts < 2:
            raise ConnectionError("smtp down")

    start, started = taskgate_clock.now(), time.monotonic()
    await gate.submit("send_email", {"to": "a@example.com"})
    (done,) = await drain(gate)
    assert done.status is Status.COMPLETED and sent == [0, 1, 2]
    assert taskgate_clock.now() - start >= timedelta(seconds=2 * 0.8 + 4 * 0.8)  # the default back-off
    assert time.monotonic() - started < 1.0


def test_the_memory_broker_fixture_runs_on_the_clock_fixture(
    memory_broker: MemoryBroker, taskgate_clock: ManualClock
) -> None:
    assert memory_broker.clock is taskgate_clock


def test_an_installed_taskgate_gives_any_project_the_fixtures(tmp_path: Path) -> None:
    # The README's own example of an app's tests, run as that app's pytest would run it.
    (tmp_path / "test_app.py").write_text(readme_block("## Testing your app"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_app.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout and "skipped" not in run.stdout
