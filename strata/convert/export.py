"""PyTorch to ONNX with dynamic batch (and sequence) axes, at opset 17 or newer.

This uses the TorchScript exporter (`dynamo=False`) rather than the torch.export one: it
needs no onnxscript, and ONNX Runtime's transformer optimiser matches its fusions against
the graphs this exporter writes.
Tracing can bake a data-dependent branch into the graph; the exporter's warnings about that
are logged here, and the parity check on samples of other shapes is what catches it.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from strata.convert.source import ConversionError, Source
from strata.wire.codec import Arrays

log = logging.getLogger(__name__)
MIN_OPSET = 17


def export(source: Source, opset: int, path: Path) -> Path:
    """Write `source.module` as ONNX to `path`, traced on its largest sample."""
    if opset < MIN_OPSET:
        raise ConversionError(f"opset {opset} is below {MIN_OPSET}, the oldest this tool writes")
    sample = max(source.samples, key=_elements)
    args = tuple(torch.from_numpy(np.ascontiguousarray(sample[d.name])) for d in source.inputs)
    dynamic_axes = {d.name: d.dynamic_axes for d in [*source.inputs, *source.outputs]}
    source.module.eval()
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.onnx.export(
                source.module,
                args,
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=[d.name for d in source.inputs],
                output_names=[d.name for d in source.outputs],
                dynamic_axes=dynamic_axes,
                do_constant_folding=True,
            )
        except Exception as exc:  # the exporter raises many unrelated types
            raise ConversionError(f"{source.description}: torch.onnx.export failed: {exc}") from exc
    _log_trace_warnings(caught)
    _check(path, opset)
    return path


def _elements(sample: Arrays) -> int:
    return sum(array.size for array in sample.values())


def _log_trace_warnings(caught: list[warnings.WarningMessage]) -> None:
    for warning in caught:
        if issubclass(warning.category, torch.jit.TracerWarning):
            where = f"{Path(warning.filename).name}:{warning.lineno}"
            log.warning("exporter, at %s: %s", where, warning.message)


def _check(path: Path, opset: int) -> None:
    model = onnx.load(str(path), load_external_data=False)
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise ConversionError(f"the exported graph is not valid ONNX: {exc}") from None
    written = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if written < opset:
        raise ConversionError(f"the exporter wrote opset {written}, not the {opset} asked for")
