"""Sessions for taskgate: `nox -s tests` (the README's test command), `nox -s lint`, `nox -s bench`,
`nox -s torture`."""

from __future__ import annotations

import nox

PYTHON_VERSIONS = ["3.11"]
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=PYTHON_VERSIONS)
def tests(session: nox.Session) -> None:
    """Run the whole test suite against every backend: memory, SQLite, PostgreSQL, MariaDB, Redis.

    Server backends use the local servers; outside CI an unreachable server skips its tests,
    with CI=true it fails them.
    """
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON_VERSIONS)
def lint(session: nox.Session) -> None:
    """Ruff (lint and format check) and mypy strict on the package."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "taskgate", "tests", "examples", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "taskgate", "tests", "examples", "benchmarks", "noxfile.py")
    session.run("mypy")


@nox.session(python=PYTHON_VERSIONS)
def bench(session: nox.Session) -> None:
    """Run the benchmarks (not part of the tests); prints JSON lines and a table."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=PYTHON_VERSIONS)
def torture(session: nox.Session) -> None:
    """The torture test (not part of the tests): a seeded workload on private servers under a
    nemesis, then a checker of the invariants; exits non-zero on any violation.

    ``nox -s torture -- --profile short|long --backend postgresql|mysql|redis|sqlite|all --seed N``
    (default: short, all backends, a random seed, printed). ``--inject-bug ignore-lease-loss
    --expect-violations`` checks the checker: it passes only if the planted bug is caught.
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "torture.run", *session.posargs, env={"PYTHONPATH": "tests"})
