"""Models from a factory function: `--module package.module:function`.

The function is called with no arguments. It returns either a `Source` (inputs, outputs and
sample batches all declared) or a `torch.nn.Module`, whose inputs and outputs the command
line declares (`--input name:dtype:dims`, `--output name[:dtype[:dims]]`); sample batches are
then drawn at random, seeded.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch

from strata.convert.source import ConversionError, Dim, Source, TensorDecl, random_samples

# Batch sizes of the random samples: one row, a few, and an odd number.
SAMPLE_BATCHES = (1, 2, 7, 3)


def parse_decl(text: str, default_dtype: str = "float32") -> TensorDecl:
    """`name:dtype:dims`, dims comma-separated: integers are fixed, names are dynamic
    (`features:float32:batch,30`, `ids:int64:batch,sequence`). dtype and dims may be left
    out (float32, and `batch` alone)."""
    name, _, rest = text.partition(":")
    dtype, _, dims_text = rest.partition(":")
    if not name:
        raise ConversionError(f"tensor declaration {text!r} has no name")
    dims: list[Dim] = [int(d) if d.isdigit() else d for d in (dims_text or "batch").split(",")]
    if any(d == "" for d in dims):
        raise ConversionError(f"tensor declaration {text!r} has an empty dimension")
    try:
        return TensorDecl(name, dtype or default_dtype, tuple(dims))
    except TypeError as exc:
        raise ConversionError(f"tensor declaration {text!r}: unknown dtype {dtype!r}") from exc


def load_factory(spec: str) -> object:
    """Import `package.module:function` and call the function."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConversionError(f"--module wants package.module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise ConversionError(f"cannot load {spec!r}: {exc}") from None
    return factory()


def factory_source(
    spec: str, inputs: Sequence[str], outputs: Sequence[str], int_high: int = 100
) -> Source:
    """The Source the factory `spec` gives, or one built around the module it gives."""
    made = load_factory(spec)
    if isinstance(made, Source):
        return made
    if not isinstance(made, torch.nn.Module):
        raise ConversionError(
            f"{spec} returned {type(made).__name__}; it must return a torch.nn.Module or a "
            "strata.convert.Source"
        )
    if not inputs:
        raise ConversionError(f"{spec} returned a module: declare its inputs with --input")
    declared = [parse_decl(text) for text in inputs]
    returned = [parse_decl(text) for text in outputs or ["output"]]
    samples = random_samples(declared, SAMPLE_BATCHES, int_high=int_high)
    return Source(made, declared, returned, samples, description=f"factory {spec}")
