"""`python -m strata.convert ...`, the same as `strata convert ...` (strata.command)."""

import sys

from strata.convert.cli import convert_main

if __name__ == "__main__":
    sys.exit(convert_main())
