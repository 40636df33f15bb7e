"""The broker protocol stays narrow: the seam a third-party broker implements (issue 34)."""

from __future__ import annotations

import inspect

from taskgate.brokers import base, split

# Every Protocol class a broker may implement, and the most public methods they may have together.
PROTOCOLS = (base.Broker, split.SplitCaller)
# 17: `Broker.hold` (issue 35) pauses and resumes a queue; 18: `Broker.prune` (issue 36) deletes
# final tasks, for retention and `Gate.purge` alike; 19: `Broker.step` (issue 39) reads or stores
# once a handler's durable step.
MOST_METHODS = 19


def _public_methods(protocol: type) -> set[str]:
    return {name for name, member in vars(protocol).items() if not name.startswith("_") and callable(member)}


def test_the_protocols_under_taskgate_brokers_are_the_ones_counted() -> None:
    found = {
        obj
        for module in (base, split)
        for obj in vars(module).values()
        if inspect.isclass(obj) and getattr(obj, "_is_protocol", False) and obj.__module__ == module.__name__
    }
    assert found == set(PROTOCOLS)


def test_the_protocols_have_at_most_nineteen_public_methods() -> None:
    count = sum(len(_public_methods(p)) for p in PROTOCOLS)
    assert count <= MOST_METHODS, sorted(m for p in PROTOCOLS for m in _public_methods(p))
