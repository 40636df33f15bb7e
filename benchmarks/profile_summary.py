"""Summarise a ``py-spy record --format raw`` profile: where the samples went, by function.

``python -m benchmarks.profile_summary PROFILE.txt [--top 25] [--match taskgate]`` prints the
functions with the most samples on the stack (inclusive) and at the top of it (self), as a
share of all samples. See ``benchmarks/README.md`` for how the profiles were recorded.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence

__all__ = ["main", "summarise"]

_FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def _name(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match.group('fn')} ({path})"


def summarise(lines: Sequence[str], match: str = "") -> tuple[int, Counter[str], Counter[str]]:
    """Total samples, inclusive samples per function, self samples per function."""
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            _name(f) for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")
        ]
        total += count
        for name in set(frames):
            if match in name:
                inclusive[name] += count
        if frames and match in frames[-1]:
            own[frames[-1]] += count
    return total, inclusive, own


def main(argv: Sequence[str] | None = None) -> None:
    """Print the summary of one raw profile."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_summary")
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--match", default="", help="only functions whose name or file contains this")
    args = p.parse_args(argv)
    with open(args.profile) as f:
        total, inclusive, own = summarise(f.readlines(), args.match)
    print(f"{total} samples")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"\n-- {title} --")
        for name, count in counter.most_common(args.top):
            print(f"{count / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
