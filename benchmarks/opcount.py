"""Python bytecodes per task of ``process.w10``, by function: a count that machine drift cannot move.

``python -m benchmarks.opcount --backend memory -n 2000 [--top 40]`` fills the store (not
counted), then runs the gate with ``workers=10`` under ``sys.settrace`` opcode events and
prints the bytecodes executed per task, in total and by function (name, first line, file).
Wall-clock rates on this machine drift by a fifth within minutes; the count of a run repeats to
the bytecode, so a change that saves work shows here even when a timed A/B cannot tell. It
counts Python bytecodes only: work inside C (a dict look-up, a driver's I/O) is not in it. For
every machine instruction, C included, run the same under ``valgrind --tool=callgrind`` (see
``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import benchmarks.processing as processing
from benchmarks.cli import ALIASES
from benchmarks.settings import Settings

__all__ = ["count_opcodes", "main"]

Where = tuple[str, str]  # (function:first line, file)


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for marker in ("/taskgate/", "/benchmarks/"):
        if marker in path:
            return marker[1:] + path.split(marker, 1)[1]
    return path


def count_opcodes(backend: str, n: int) -> Counter[Where]:
    """Bytecodes executed by the gate's run of ``n`` no-op tasks, by function (fill excluded)."""
    counts: Counter[Where] = Counter()

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[(f"{code.co_name}:{code.co_firstlineno}", _short(code.co_filename))] += 1
        return trace

    run = processing.anyio.run

    def traced_run(fn: Callable[[], float]) -> float:
        sys.settrace(trace)
        try:
            return run(fn)
        finally:
            sys.settrace(None)

    processing.anyio.run = traced_run  # type: ignore[assignment]
    try:
        processing.process_in_process(backend, Settings(n=n, run_cap=3600.0), workers=10)
    finally:
        processing.anyio.run = run
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    """Count one run and print the bytecodes per task, in total and by function."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.opcount")
    p.add_argument("--backend", default="memory")
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    counts = count_opcodes(ALIASES.get(args.backend, args.backend), args.n)
    print(f"{sum(counts.values()) / args.n:,.0f} bytecodes per task")
    for (function, path), count in counts.most_common(args.top):
        print(f"{count / args.n:8.1f}  {function:<40} {path}")


if __name__ == "__main__":
    main()
