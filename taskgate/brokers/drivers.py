"""The drivers each backend needs, and the extra that installs them: the one message a missing
driver gets, wherever it is found missing."""

from __future__ import annotations

from taskgate.errors import ConfigError

__all__ = ["EXTRAS", "missing_driver"]

# Driver module -> the taskgate extra that installs it.
EXTRAS = {"psycopg": "postgresql", "pymysql": "mysql", "redis": "redis"}


def missing_driver(what: str, driver: str, exc: ImportError) -> ConfigError:
    """The `ConfigError` for ``what`` (a URL scheme or a broker) whose ``driver`` module failed
    to import with ``exc``, naming the extra that installs it (or the module, for a driver
    taskgate installs none for)."""
    extra = EXTRAS.get(driver)
    fix = f"pip install 'taskgate[{extra}]'" if extra else f"install the {driver!r} module"
    return ConfigError(f"{what} needs the {driver} driver, which cannot be imported ({exc}): {fix}")
