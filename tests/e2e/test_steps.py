"""A worker process killed with SIGKILL between two durable steps: the run that takes its task
back gets the first step's stored result instead of doing its work again, then does the second.

Runs on the backends other processes can share (SQLite, PostgreSQL, MariaDB, Redis); the memory
broker's retry case is in tests/integration/test_gate_steps.py. The child's handler does step
``charge`` (one line in a file), writes a "reached" file and blocks; the test kills it there,
and its own gate reaps the expired lease and runs the task again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from taskgate import QueueConfig, Status

from .backends import CROSS_PROCESS_BACKENDS, Backend, GateFactory
from .step_worker import step_handler

pytestmark = pytest.mark.anyio

LEASE_TTL = 1.0  # seconds: short, so the reaper takes the task back within a couple of seconds
WAIT = 30.0
TESTS_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where the handler's steps write their lines, shared with the child process."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def child(backend: Backend, workdir: Path, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`e2e.step_worker` on the backend's store, in a child process (killed after, if alive)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "e2e.step_worker", json.dumps(backend.spec), str(workdir), str(LEASE_TTL)]
    with (tmp_path / "worker.log").open("wb") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


async def _appears(path: Path) -> bool:
    """Whether ``path`` exists within `WAIT` seconds (written by the child process)."""
    with anyio.move_on_after(WAIT):
        while True:
            if await anyio.Path(path).exists():
                return True
            await anyio.sleep(0.02)
    return False


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("backend", CROSS_PROCESS_BACKENDS, indirect=True)
async def test_a_worker_killed_between_two_steps_leaves_the_first_done_once(
    backend: Backend,
    make_gate: GateFactory,
    workdir: Path,
    child: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    # workers=2: on Redis the dead worker's global concurrency slot stays taken until it expires.
    gate = make_gate(queues={"shop": QueueConfig(workers=2, lease_ttl=LEASE_TTL)}, routes={"order": "shop"})
    gate.handle("order", step_handler(workdir))
    task_id = await gate.submit("order")  # this gate runs nothing yet: the child claims the task
    if not await _appears(workdir / "reached"):
        log = (tmp_path / "worker.log").read_text(errors="replace")
        pytest.fail(f"the child never got between its steps; its output:\n{log}")
    assert _lines(workdir / "charged") == [task_id] and not _lines(workdir / "shipped")
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL

    async with gate:
        result = await gate.wait_json(task_id, timeout=WAIT)
        task = await gate.get(task_id)
    assert result == {"charge": "charged 1", "ship": "shipped 1"}
    assert _lines(workdir / "charged") == [task_id]  # the second run read step 1 from the store
    assert _lines(workdir / "shipped") == [task_id]
    assert (task.status, task.claims, task.lease_lost, task.attempts) == (Status.COMPLETED, 2, 1, 0)
