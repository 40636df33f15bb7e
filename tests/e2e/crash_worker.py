"""A Gate worker in its own process, for the SIGKILL scenario: it runs until it is killed.

Usage: ``python -m e2e.crash_worker SPEC_JSON GATEWAY_URL LEASE_TTL_SECONDS`` (with ``tests/``
on ``PYTHONPATH``). It serves the ``complete`` type on queue ``llm`` with the same handler as
the test, against the store that SPEC_JSON names (see `e2e.backends.open_from_spec`).
"""

from __future__ import annotations

import json
import sys

import anyio

from taskgate import Config, Gate, QueueConfig

from .backends import open_from_spec
from .handlers import complete_handler


def main(argv: list[str]) -> None:
    """Run a worker on the store of ``argv[0]``, calling the gateway at ``argv[1]``."""
    spec, gateway_url, lease_ttl = json.loads(argv[0]), argv[1], float(argv[2])
    gate = Gate(
        Config(
            broker=open_from_spec(spec),
            queues={"llm": QueueConfig(workers=1, lease_ttl=lease_ttl)},
            routes={"complete": "llm"},
        )
    )
    gate.handle("complete", complete_handler(gateway_url))
    anyio.run(gate.run)


if __name__ == "__main__":
    main(sys.argv[1:])
