"""A Gate worker whose handler runs durable steps, for the SIGKILL scenario of test_steps.py.

Usage: ``python -m e2e.step_worker SPEC_JSON WORKDIR LEASE_TTL_SECONDS`` (with ``tests/`` on
``PYTHONPATH``). It serves type ``order`` on queue ``shop`` with `step_handler`, against the
store that SPEC_JSON names (see `e2e.backends.open_from_spec`), until it is killed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

import taskgate
from taskgate import Config, Gate, QueueConfig, Task

from .backends import open_from_spec

__all__ = ["step_handler"]


def _append(path: Path, line: str) -> str:
    """Append ``line`` to ``path`` (the step's side effect, counted by the test); the file's
    name and its number of lines after."""
    with path.open("a") as file:
        file.write(line + "\n")
    return f"{path.name} {len(path.read_text().splitlines())}"


def step_handler(workdir: Path) -> Callable[[Task], Awaitable[dict[str, Any]]]:
    """Step ``charge`` (a line in ``workdir/charged``), then on the task's first run write
    ``workdir/reached`` and block forever -- where the test kills the process --, else step
    ``ship`` (a line in ``workdir/shipped``) and return both steps' results."""

    async def order(task: Task) -> dict[str, Any]:
        charged = await taskgate.step("charge", _append, workdir / "charged", task.id)
        if task.first_run:
            (workdir / "reached").write_text(task.id)
            await anyio.sleep_forever()
        shipped = await taskgate.step("ship", _append, workdir / "shipped", task.id)
        return {"charge": charged, "ship": shipped}

    return order


def main(argv: list[str]) -> None:
    """Run a worker on the store of ``argv[0]``, its steps' files in ``argv[1]``."""
    spec, workdir, lease_ttl = json.loads(argv[0]), Path(argv[1]), float(argv[2])
    gate = Gate(
        Config(
            broker=open_from_spec(spec),
            queues={"shop": QueueConfig(workers=1, lease_ttl=lease_ttl)},
            routes={"order": "shop"},
        )
    )
    gate.handle("order", step_handler(workdir))
    anyio.run(gate.run)


if __name__ == "__main__":
    main(sys.argv[1:])
