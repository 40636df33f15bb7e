"""`taskgate.forks`: what registers is reset in a forked child, each object on its own."""

from __future__ import annotations

import json
import os
import time

import pytest

from taskgate import forks
from taskgate.ids import encode_ulid, new_id, new_ids

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


def test_a_forked_child_makes_no_id_its_parent_makes_in_the_same_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One millisecond for parent and child alike: ids.py reads the time from `time.time_ns`.
    frozen = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    new_id()  # the parent's generator now holds this millisecond and its random part
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through the pipe and its exit status
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(new_ids(100) + [new_id() for _ in range(100)]).encode())
            os.close(write_end)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        made_by_child = json.loads(pipe.read())
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    made_by_parent = new_ids(100) + [new_id() for _ in range(100)]
    assert {i[:10] for i in made_by_child + made_by_parent} == {encode_ulid(frozen // 1_000_000, 0)[:10]}
    assert not set(made_by_child) & set(made_by_parent)
