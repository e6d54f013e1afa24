"""`python -m bench`: the bench's one entry point (`bench.cli`; `python -m bench --help` lists its options)."""

from __future__ import annotations

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
