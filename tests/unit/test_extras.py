"""The extras pyproject.toml declares: one per driver and integration, and `all` of them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from taskgate.brokers.drivers import EXTRAS

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
NAMED = {"postgresql", "mysql", "redis", "trio", "prometheus", "otel", "dashboard"}


def extras() -> dict[str, list[str]]:
    with PYPROJECT.open("rb") as f:
        declared: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return declared


def test_every_named_extra_is_declared_and_all_installs_each() -> None:
    declared = extras()
    (all_of,) = declared["all"]

    assert NAMED <= set(declared)
    assert set(re.fullmatch(r"taskgate\[(.*)\]", all_of).group(1).split(",")) == NAMED  # type: ignore[union-attr]


def test_the_extra_a_missing_driver_names_installs_that_driver() -> None:
    declared = extras()
    for driver, extra in EXTRAS.items():
        assert any(requirement.lower().startswith(driver) for requirement in declared[extra]), (driver, extra)


def test_the_test_extra_installs_everything() -> None:
    assert "taskgate[all]" in extras()["test"]
