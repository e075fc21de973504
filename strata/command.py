"""The `strata` console script: `strata convert ...` and `strata admin ...`.

It lives beside both packages, not in either: the converter must stay free of the serving
stack, and serving must never need the converter, so neither imports the other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from strata.convert import cli as convert_cli
from strata.tools import admin_client


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the subcommand and run it; its exit status."""
    parser = argparse.ArgumentParser(prog="strata", description="Strata tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    convert_cli.add_arguments(
        commands.add_parser("convert", help=convert_cli.__doc__.splitlines()[0])
    )
    admin_client.add_arguments(
        commands.add_parser("admin", help=admin_client.__doc__.splitlines()[0])
    )
    args = parser.parse_args(argv)
    return admin_client.run(args) if args.command == "admin" else convert_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
