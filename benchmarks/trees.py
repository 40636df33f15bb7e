"""This tree against another checkout (e.g. main), A/B in one session.

``python -m benchmarks.trees --other ../main [--backend pg] --what w10 --rounds 8`` alternates,
round by round, one run of ``what`` by this tree and one by the other -- each a fresh process
with that tree's working directory and interpreter (``<other>/.venv/bin/python`` unless
``--other-python``), on a fresh store -- and prints the rates and the paired ratios (above 1:
this tree is faster). ``--what``: ``submit`` (sequential ``gate.submit``, the gate not started)
or ``w10`` / ``w100`` (``n`` pre-filled no-op tasks drained by a started gate with that many
workers). ``--cpu``: tasks per second of the measuring process's CPU time (user + system)
instead of wall time -- on a machine other work keeps busy, wall rates swing by half from run to
run, while the CPU a task costs in the process barely moves (it leaves out the database
server's share). Only names both trees have are used (`benchmarks.common`, `benchmarks.stores`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.cli import choose
from benchmarks.common import alternate
from benchmarks.stores import BACKENDS

__all__ = ["main", "measure"]

# One run, in the tree whose working directory it is started in: prints tasks per second.
_RUN = """
import sys
import time
import anyio
from benchmarks.common import QUEUE, calls_per_second, drain_rate, enqueue_noops, make_gate
from benchmarks.stores import isolated_store

backend, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


async def submits(broker):
    gate = make_gate(broker)
    return await calls_per_second(lambda: gate.submit(QUEUE), n)


with isolated_store(backend) as store:
    broker = store.open()
    try:
        if what != "submit":
            enqueue_noops(broker, n)
        cpu = time.process_time()
        if what == "submit":
            rate = anyio.run(submits, broker)
        else:
            rate = anyio.run(drain_rate, broker, n, int(what.removeprefix("w")))
        cpu = time.process_time() - cpu
    finally:
        broker.close()
print(rate, n / cpu)
"""

_ROOT = Path(__file__).resolve().parents[1]


def measure(python: str, tree: Path, backend: str, what: str, n: int, *, cpu: bool = False) -> float:
    """One run of ``what`` by the tree at ``tree`` with ``python``: tasks per second (of its
    CPU time with ``cpu``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [python, "-c", _RUN, backend, what, str(n)], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"a run in {tree} failed (exit code {done.returncode}):\n{done.stderr}")
    wall, per_cpu = done.stdout.strip().splitlines()[-1].split()
    return float(per_cpu if cpu else wall)


def main(argv: Sequence[str] | None = None) -> None:
    """Print each tree's median and samples, then the paired ratios (`alternate`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trees")
    parser.add_argument("--other", required=True, help="the other checkout (its root directory)")
    parser.add_argument("--other-python", help="its interpreter (default <other>/.venv/bin/python)")
    parser.add_argument("--backend", default="memory", help="one of memory,sqlite,pg,mariadb,redis")
    parser.add_argument("--what", choices=["submit", "w10", "w100"], default="w10")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("-n", type=int, default=0, help="calls or tasks per run (default 2,000 / 10,000)")
    parser.add_argument("--cpu", action="store_true", help="rates per second of the process's CPU time")
    args = parser.parse_args(argv)
    (backend,) = choose(args.backend, list(BACKENDS), "backend")
    other = Path(args.other).resolve()
    other_python = args.other_python or str(other / ".venv" / "bin" / "python")
    n = args.n or (2000 if args.what == "submit" else 10_000)
    sides = {"this": (sys.executable, _ROOT), "other": (other_python, other)}
    alternate(
        list(sides),
        lambda side: measure(*sides[side], backend, args.what, n, cpu=args.cpu),
        f"{backend} {args.what}{' per CPU s' if args.cpu else ''}",
        args.rounds,
        latency=False,
    )


if __name__ == "__main__":
    main()
