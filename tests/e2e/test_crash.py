"""A worker process killed with SIGKILL mid-handler: its task comes back after the lease.

Runs on the backends other processes can share (SQLite, PostgreSQL, MariaDB, Redis). The
child process claims the task and is killed while its gateway call is held open; the test's
own gate then reaps the expired lease and runs the task exactly once more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from taskgate import QueueConfig, Status

from .backends import CROSS_PROCESS_BACKENDS, Backend, GateFactory
from .gateway import Gateway
from .handlers import complete_handler

pytestmark = pytest.mark.anyio

LEASE_TTL = 1.0  # seconds: short, so the reaper takes the task back within a couple of seconds
WAIT = 30.0
TESTS_DIR = Path(__file__).resolve().parent.parent


SpawnWorker = Callable[[Backend, str], "subprocess.Popen[bytes]"]


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[SpawnWorker]:
    """Start `e2e.crash_worker` in a child process; any child still alive is killed after."""
    children: list[subprocess.Popen[bytes]] = []

    def spawn(backend: Backend, gateway_url: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        }
        log = (tmp_path / f"worker-{len(children)}.log").open("wb")
        args = [
            sys.executable,
            "-m",
            "e2e.crash_worker",
            json.dumps(backend.spec),
            gateway_url,
            str(LEASE_TTL),
        ]
        child = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        children.append(child)
        return child

    yield spawn
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def worker_log(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("worker-*.log")))


@pytest.mark.parametrize("backend", CROSS_PROCESS_BACKENDS, indirect=True)
async def test_a_worker_killed_mid_handler_gets_its_task_back_and_it_runs_once_more(
    backend: Backend, make_gate: GateFactory, gateway: Gateway, spawn_worker: SpawnWorker, tmp_path: Path
) -> None:
    gateway.configure(hold=True)
    # workers=2: on Redis the dead worker's global concurrency slot stays taken until it expires.
    gate = make_gate(queues={"llm": QueueConfig(workers=2, lease_ttl=LEASE_TTL)}, routes={"complete": "llm"})
    gate.handle("complete", complete_handler(gateway.url))
    task_id = await gate.submit("complete", {"prompt": "survive the crash"})  # not running yet

    child = spawn_worker(backend, gateway.url)
    try:
        await anyio.to_thread.run_sync(
            gateway.wait_until, lambda c: c.tag(task_id) == 1 and c.held == 1, WAIT
        )
    except TimeoutError:
        pytest.fail(f"the child worker never called the gateway; its output:\n{worker_log(tmp_path)}")
    claimed = await gate.get(task_id)
    assert (claimed.status, claimed.claims) == (Status.RUNNING, 1)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL
    gateway.release()  # the dead worker's held call is answered into the void

    async with gate:
        result = await gate.wait(task_id, timeout=WAIT)
        task = await gate.get(task_id)
    assert json.loads(result or b"null") == "SURVIVE THE CRASH"
    assert (task.status, task.claims, task.lease_lost, task.attempts, task.throttled) == (
        Status.COMPLETED,
        2,
        1,
        0,
        0,
    )
    assert gateway.settled().tag(task_id) == 2
    # The second claim waited for the first lease to run out (both times on the broker's clock).
    assert claimed.started_at and task.started_at
    assert task.started_at - claimed.started_at >= timedelta(seconds=LEASE_TTL)
