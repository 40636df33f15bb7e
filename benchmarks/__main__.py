"""Entry point: ``python -m benchmarks [--quick] [--backend pg,redis] [--only submit,process]``."""

from benchmarks.cli import main

raise SystemExit(main())
