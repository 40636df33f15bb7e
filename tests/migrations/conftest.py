"""The databases the migration tests run on."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind (a fresh, uniquely named one on a server)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'migrated.db'}"
    fixture = "postgresql_url" if request.param == "postgresql" else "mysql_url"
    return str(request.getfixturevalue(fixture))
