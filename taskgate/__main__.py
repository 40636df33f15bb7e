"""``python -m taskgate``: the ``taskgate`` command line."""

from __future__ import annotations

import sys

from taskgate.cli import main

if __name__ == "__main__":
    sys.exit(main())
