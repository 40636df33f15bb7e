"""The torture test (`nox -s torture`): real processes, a nemesis, and a checker of invariants.

`run` drives one run per backend: producers (`producer`) submit a seeded workload, workers
(`worker`) run it, `nemesis` injects faults (SIGKILL, server restarts, a `proxy` between each
worker and the store, clock skew), then `checker` proves the invariants from every process's
`ledger` and the final store. Only ``test_checker.py`` is collected by pytest; the rest runs
through ``python -m torture.run`` with ``tests/`` on ``PYTHONPATH``.
"""
