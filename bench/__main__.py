"""python -m bench [--config FILE] [--quick]: every benchmark, one after the other (`make bench`).

The suite (ceilings, hops, load sweep, tracing on and off), the flights comparison, the peer
benchmark (MLServer, KServe, a bare v2 server), the batching benchmark, and the text models'
benchmark when they have been built. Each writes its tables under bench/results/.
"""

import argparse
from pathlib import Path

from bench import batching, flights, suite, text
from bench.peers import run as peers
from strata.config import load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--text-config", type=Path, default=Path("configs/text.yaml"))
    parser.add_argument("--quick", action="store_true", help="short smoke runs")
    args = parser.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    code = suite.main(["--config", str(args.config), *quick])
    flights.main(["--config", str(args.config), *quick])
    peers.main(["--config", str(args.config), *quick])
    batching.main(["--config", str(args.config), *quick])
    repository = load_settings(args.text_config).repository
    if (repository / "minilm").is_dir():
        text.main(["--config", str(args.text_config), *quick])
    else:
        print("text models not built (make models-text): text benchmark skipped")
    return code or 0


if __name__ == "__main__":
    raise SystemExit(main())
