"""Turn a PyTorch model into a model-repository entry: `strata convert`.

Exit status: 0 written; 1 the conversion could not run (bad arguments, export failure);
3 refused, because the ONNX model does not match PyTorch within the tolerance.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# PyTorch loads only once a conversion runs, so `--help` and its error message work without.
if TYPE_CHECKING:
    from strata.convert.pipeline import Options, Result
    from strata.convert.source import Source

EXIT_FAILED = 1
EXIT_PARITY = 3
PROG = "strata convert"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The convert command's options."""
    parser.add_argument("name", help="model name in the repository (its folder name)")
    parser.add_argument("--repository", type=Path, required=True, help="model repository folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--module",
        metavar="PACKAGE.MODULE:FUNCTION",
        help="a function returning a torch.nn.Module (declare --input) or a strata.convert.Source",
    )
    source.add_argument(
        "--sentence-transformers",
        type=Path,
        metavar="FOLDER",
        help="a sentence-transformers model folder (with tokenizer.json); pooling and "
        "normalisation go into the graph",
    )
    _add_tensor_arguments(parser)
    _add_text_arguments(parser)
    _add_build_arguments(parser)


def _add_tensor_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("inputs and outputs of a --module model")
    group.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:DTYPE:DIMS",
        help="an input, in call order; DIMS comma-separated, names dynamic "
        "(features:float32:batch,30)",
    )
    group.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="NAME[:DTYPE[:DIMS]]",
        help="an output, in return order (default: one output named 'output')",
    )
    group.add_argument(
        "--int-high", type=int, default=100, help="random integer inputs are drawn below this"
    )


def _add_text_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sentence-transformers models")
    group.add_argument(
        "--topics",
        type=Path,
        metavar="FILE",
        help="YAML of labels with descriptions: append a zero-shot topic head",
    )
    group.add_argument(
        "--texts", type=Path, metavar="FILE", help="more sample texts for parity, one a line"
    )
    group.add_argument(
        "--max-length", type=int, help="tokens per text (default: the model's max_seq_length)"
    )


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("conversion")
    group.add_argument("--version", type=int, help="version folder (default: the next one)")
    group.add_argument("--overwrite", action="store_true", help="replace an existing version")
    group.add_argument("--opset", type=int, default=17, help="ONNX opset, 17 or newer")
    group.add_argument(
        "--optimise",
        choices=["auto", "transformer", "basic", "none"],
        default="auto",
        help="auto: the transformer optimiser for BERT-like models, else basic",
    )
    group.add_argument(
        "--quantise", choices=["none", "int8"], default="none", help="dynamic int8 quantisation"
    )
    group.add_argument(
        "--per-tensor", action="store_true", help="one int8 scale per weight, not per channel"
    )
    group.add_argument("--atol", type=float, help="max |diff| allowed (fp32 1e-4, int8 0.1)")
    group.add_argument(
        "--min-cosine", type=float, help="lowest row cosine allowed (fp32 0.9999, int8 0.97)"
    )
    group.add_argument("--max-batch-size", type=int, default=64, help="model.yaml max_batch_size")
    group.add_argument("--cases", type=int, default=4, help="validation cases to write")


def run(args: argparse.Namespace) -> int:
    """Convert as `args` say; print the outcome; return the exit status."""
    _setup_logging()
    try:
        from strata.convert.pipeline import convert
        from strata.convert.source import ConversionError, ParityError
    except ImportError as exc:
        print(f"{PROG} needs PyTorch ({exc}): pip install -e '.[convert]'", file=sys.stderr)
        return EXIT_FAILED
    try:
        source = _source(args)
        result = convert(source, _options(args))
    except ParityError as exc:
        print(f"{PROG}: refused, nothing written: {exc}", file=sys.stderr)
        return EXIT_PARITY
    except ConversionError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    _print_result(result)
    return 0


def _source(args: argparse.Namespace) -> Source:
    if args.module:
        from strata.convert.factory import factory_source

        return factory_source(args.module, args.input, args.output, args.int_high)
    from strata.convert.text import read_topics, sentence_source

    topics = read_topics(args.topics) if args.topics else None
    texts = _read_texts(args.texts) if args.texts else []
    return sentence_source(args.sentence_transformers, topics, texts, args.max_length)


def _read_texts(path: Path) -> list[str]:
    from strata.convert.source import ConversionError

    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise ConversionError(f"cannot read texts file {path}: {exc.strerror}") from None


def _options(args: argparse.Namespace) -> Options:
    from strata.convert.parity import FP32, INT8, Tolerance
    from strata.convert.pipeline import Options

    precision = "int8" if args.quantise == "int8" else "fp32"
    default = INT8 if precision == "int8" else FP32
    tolerance = Tolerance(
        atol=default.atol if args.atol is None else args.atol,
        min_cosine=default.min_cosine if args.min_cosine is None else args.min_cosine,
    )
    return Options(
        name=args.name,
        repository=args.repository,
        version=args.version,
        overwrite=args.overwrite,
        opset=args.opset,
        optimise=args.optimise,
        precision=precision,
        per_channel=not args.per_tensor,
        tolerance=tolerance,
        max_batch_size=args.max_batch_size,
        cases=args.cases,
    )


def _print_result(result: Result) -> None:
    size = (result.folder / "model.onnx").stat().st_size / 1e6
    print(f"{result.folder} ({size:.1f} MB, {result.report['precision']})")
    fused = result.report.get("fused")
    print(f"  optimiser: {result.report['optimiser']}" + (f" fused {fused}" if fused else ""))
    print(f"  parity ({result.tolerance.describe()}):")
    for p in result.parity:
        print(
            f"    {p.name}: max |diff| {p.max_abs_diff:.3g}, min cosine {p.min_cosine:.6f} "
            f"over {p.rows} rows"
        )


def convert_main(argv: list[str] | None = None) -> int:
    """`python -m strata.convert ARGS`, the same as `strata convert ARGS` (strata.command)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _setup_logging() -> None:
    # The optimiser's and quantiser's INFO lines would drown the conversion's own.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("strata.convert").setLevel(logging.INFO)
