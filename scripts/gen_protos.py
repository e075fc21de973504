"""Generate the Python stubs from protos/ (the `make proto` target).

Compiled with `-I protos`, a file at protos/strata/proto/X.proto becomes strata/proto/X_pb2.py,
so the generated modules import each other with no patching.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def generate(out: Path) -> None:
    """Write *_pb2.py, *_pb2_grpc.py and *.pyi for every proto under protos/ into `out`."""
    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    for folder in {(out / f).parent for f in files}:
        (folder / "__init__.py").touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo)")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
