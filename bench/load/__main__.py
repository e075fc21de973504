"""`python -m bench.load`: the ghz-compatible load tool (see bench/load/cli.py)."""

import sys

from bench.load.cli import main

if __name__ == "__main__":
    sys.exit(main())
