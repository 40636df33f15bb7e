"""taskgate's benchmark harness (not part of the test run): ``python -m benchmarks --help``.

Every figure is measured on a store of its own (a fresh PostgreSQL/MariaDB database, a SQLite
temp file, a random Redis key prefix), printed as one JSON line, and set beside the raw-driver
floor of the same server measured in the same run. See ``benchmarks/README.md``.
"""
