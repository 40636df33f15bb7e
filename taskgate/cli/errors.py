"""The one error the command line reports as it is: a message for the operator, exit status 1."""

from __future__ import annotations

__all__ = ["CLIError", "one_line"]


class CLIError(Exception):
    """Raised for bad input the command line itself finds; its message is shown as it is."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message (driver errors add SQL and links below it),
    prefixed with its type when the message alone would not say what failed."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if isinstance(exc, CLIError) and text:
        return text
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
