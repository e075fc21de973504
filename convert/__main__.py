"""`python -m convert ...`, the same as `strata convert ...` (the console script: strata_cli)."""

import sys

from convert.cli import convert_main

if __name__ == "__main__":
    sys.exit(convert_main())
