"""Graph optimisation with ONNX Runtime, done once at conversion so every load is cheaper.

BERT-like models go through ONNX Runtime's transformer optimiser, which fuses embeddings,
attention, GELU and layer normalisation into single kernels. It runs at `opt_level=0`: only
its own fusions, whose contrib ops both the CPU and CUDA providers implement; the serving
session then applies ONNX Runtime's machine-specific optimisations where it runs. Other
models get ONNX Runtime's basic level only (constant folding, redundant node removal), which
is provider-independent; the extended levels may write provider-specific nodes.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import onnxruntime as ort

from strata.convert.source import ConversionError, Source

log = logging.getLogger(__name__)
MODES = ("auto", "transformer", "basic", "none")


def optimise(source: Source, mode: str, path: Path, out: Path) -> dict[str, Any]:
    """Write the optimised graph of `path` to `out`; returns what was done, for the report."""
    if mode not in MODES:
        raise ConversionError(f"optimise must be one of {list(MODES)}, got {mode!r}")
    if mode == "auto":
        mode = "transformer" if source.model_type else "basic"
    if mode == "transformer":
        return _transformer(source, path, out)
    if mode == "basic":
        return _basic(path, out)
    shutil.copyfile(path, out)
    return {"optimiser": "none"}


def _transformer(source: Source, path: Path, out: Path) -> dict[str, Any]:
    from onnxruntime.transformers import optimizer

    if not source.model_type:
        raise ConversionError(
            f"{source.description}: the transformer optimiser needs a model type (e.g. bert); "
            "use --optimise basic for this model"
        )
    model = optimizer.optimize_model(
        str(path),
        model_type=source.model_type,
        num_heads=source.num_heads,
        hidden_size=source.hidden_size,
        opt_level=0,
        use_gpu=False,
    )
    model.save_model_to_file(str(out))
    fused = {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    log.info("transformer optimiser (%s) fused %s", source.model_type, fused or "nothing")
    return {"optimiser": f"transformer ({source.model_type})", "fused": fused}


def _basic(path: Path, out: Path) -> dict[str, Any]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return {"optimiser": "onnxruntime basic"}
