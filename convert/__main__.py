"""`strata convert ...` (the console script runs `main`) or `python -m convert ...`."""

import sys

from convert.cli import convert_main, main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(convert_main())
