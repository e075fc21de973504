"""The conversion, step by step: export, optimise, quantise, check parity, write the entry.

Nothing is written to the repository until parity has passed; a refused conversion leaves
the repository as it was.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from strata.convert.entry import case_arrays, check_name, choose_version, write_entry
from strata.convert.export import MIN_OPSET, export
from strata.convert.optimise import optimise
from strata.convert.parity import (
    FP32,
    INT8,
    OutputParity,
    Tolerance,
    check,
    compare,
    onnx_outputs,
    reference_outputs,
)
from strata.convert.quantise import PRECISIONS, quantise
from strata.convert.source import ConversionError, Source, rows
from strata.wire.codec import Arrays

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """How to convert, and where the entry goes."""

    name: str
    repository: Path
    version: int | None = None  # None: one past the highest version there is
    overwrite: bool = False
    opset: int = MIN_OPSET
    optimise: str = "auto"
    precision: str = "fp32"
    per_channel: bool = True
    tolerance: Tolerance | None = None  # None: the precision's default
    max_batch_size: int = 64
    cases: int = 4

    @property
    def accepted(self) -> Tolerance:
        if self.tolerance is not None:
            return self.tolerance
        return INT8 if self.precision == "int8" else FP32


@dataclass
class Result:
    """A written entry and the parity it was accepted with."""

    folder: Path
    version: int
    parity: list[OutputParity]
    tolerance: Tolerance
    report: dict[str, Any]


def convert(source: Source, options: Options) -> Result:
    """Convert `source` into `options.repository`; raises ParityError instead of writing a
    model that does not match PyTorch."""
    check_name(options.name)
    _check_options(source, options)
    model_folder = options.repository / options.name
    version = choose_version(model_folder, options.version, options.overwrite)
    tolerance = options.accepted
    with tempfile.TemporaryDirectory(prefix="strata-convert-") as work:
        model, steps = _build(source, options, Path(work))
        reference, parity = _parity(source, model)
        report = _report(source, options, steps, parity, tolerance) | signature(model)
        check(parity, tolerance)
        cases = [
            case_arrays(source.samples[i], reference[i], tolerance.atol)
            for i in range(min(options.cases, len(source.samples)))
        ]
        folder = write_entry(
            model_folder, version, model, cases, source.files, _manifest(source, options), report
        )
    log.info("wrote %s", folder)
    return Result(folder, version, parity, tolerance, report)


def _check_options(source: Source, options: Options) -> None:
    if options.precision not in PRECISIONS:
        raise ConversionError(f"precision must be one of {list(PRECISIONS)}")
    cases = source.samples[: options.cases]
    too_big = [i for i, sample in enumerate(cases) if rows(sample) > options.max_batch_size]
    if too_big:
        raise ConversionError(
            f"sample {too_big[0]} has more rows than max_batch_size {options.max_batch_size}"
        )


def _build(source: Source, options: Options, work: Path) -> tuple[Path, dict[str, Any]]:
    steps: dict[str, Any] = {}
    started = time.perf_counter()
    exported = export(source, options.opset, work / "exported.onnx")
    steps["export_seconds"] = _since(started)
    started = time.perf_counter()
    model = work / "optimised.onnx"
    steps |= optimise(source, options.optimise, exported, model)
    steps["optimise_seconds"] = _since(started)
    if options.precision == "int8":
        started = time.perf_counter()
        quantised = work / "quantised.onnx"
        steps |= quantise(model, quantised, options.per_channel)
        steps["quantise_seconds"] = _since(started)
        model = quantised
    log.info("built %s: %s", options.name, steps)
    return model, steps


def _parity(source: Source, model: Path) -> tuple[list[Arrays], list[OutputParity]]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    reference = reference_outputs(source)
    return reference, compare(source, reference, onnx_outputs(session, source))


def _manifest(source: Source, options: Options) -> dict[str, Any]:
    keys: dict[str, Any] = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": options.max_batch_size,
    }
    if source.padding:
        keys["padding"] = dict(source.padding)
    return keys | source.manifest


def _report(
    source: Source,
    options: Options,
    steps: dict[str, Any],
    parity: list[OutputParity],
    tolerance: Tolerance,
) -> dict[str, Any]:
    return {
        "source": source.description,
        "opset": options.opset,
        "precision": options.precision,
        **steps,
        "tolerance": asdict(tolerance),
        "parity": {
            "samples": len(source.samples),
            **{p.name: {k: v for k, v in asdict(p).items() if k != "name"} for p in parity},
        },
        **source.facts,
        "versions": {pkg: _version(pkg) for pkg in ("torch", "onnx", "onnxruntime")},
    }


def signature(model: Path) -> dict[str, dict[str, str]]:
    """The inputs and outputs as the written graph has them (`float32[batch, 1000]`): what
    serving checks pipelines against, whatever the command line declared."""
    graph = onnx.load(str(model), load_external_data=False).graph
    return {
        "inputs": {value.name: _shape(value) for value in graph.input},
        "outputs": {value.name: _shape(value) for value in graph.output},
    }


def _shape(value: onnx.ValueInfoProto) -> str:
    tensor = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    dims = [d.dim_param or str(d.dim_value) for d in tensor.shape.dim]
    return f"{dtype}[{', '.join(dims)}]"


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 2)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
