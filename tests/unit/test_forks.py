"""`taskgate.forks`: what registers is reset in a forked child, each object on its own."""

from __future__ import annotations

import os

import pytest

from taskgate import forks

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


class _Resettable:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.reset_in = 0

    def after_fork_in_child(self) -> None:
        if self.fails:
            raise RuntimeError("cannot reset")
        self.reset_in = os.getpid()


def test_every_registered_object_is_reset_in_the_child_even_when_others_fail() -> None:
    # Half of them fail; registration order says nothing of the order they are reset in.
    objects = [_Resettable(fails=n % 2 == 1) for n in range(20)]
    for obj in objects:
        forks.register(obj)
    good = [obj for obj in objects if not obj.fails]
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through its exit status
        code = 1
        try:
            code = 0 if {obj.reset_in for obj in good} == {os.getpid()} else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert {obj.reset_in for obj in good} == {0}  # the parent's objects are left as they were
