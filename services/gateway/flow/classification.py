"""Triton's classification extension: an output asked for with the `classification`
parameter (tritonclient's `class_count`) comes back as the top classes of each row, as BYTES
strings "score:index" or "score:index:label", highest first, instead of the raw scores."""

from __future__ import annotations

import numpy as np

from strata.config.pipelines import OutputSpec, Pipeline
from strata.errors import InvalidArgument, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

PARAMETER = "classification"
SCORES = ("FP16", "FP32", "FP64")


def class_counts(request: v2.ModelInferRequest, pipeline: Pipeline) -> dict[str, int]:
    """The outputs the request asks classes of, and how many; a count that is not a positive
    integer, or an output that is not of a floating-point datatype, is INVALID_ARGUMENT."""
    counts: dict[str, int] = {}
    if not request.outputs:  # the usual request: every output, none classified
        return counts
    specs = {spec.name: spec for spec in pipeline.outputs}
    for output in request.outputs:
        parameter = output.parameters.get(PARAMETER)
        if parameter is None:
            continue
        count = parameter.int64_param
        if parameter.WhichOneof("parameter_choice") != "int64_param" or count < 1:
            raise InvalidArgument(
                f"output {shown(output.name)}: {PARAMETER} must be a positive integer "
                "(the number of classes to return)"
            )
        spec = specs.get(output.name)
        if spec is not None and spec.datatype not in SCORES:
            raise InvalidArgument(
                f"output {shown(output.name)} is {spec.datatype}: {PARAMETER} applies to "
                f"outputs of {', '.join(SCORES)}"
            )
        counts[output.name] = count
    return counts


def classified(outputs: codec.Arrays, counts: dict[str, int], pipeline: Pipeline) -> codec.Arrays:
    """`outputs` with each output of `counts` replaced by its top classes: [rows, count] for
    a batched pipeline (each row's elements ranked), else [count] over the whole tensor."""
    if not counts:
        return outputs
    specs = {spec.name: spec for spec in pipeline.outputs}
    out = dict(outputs)
    for name, count in counts.items():
        if name in outputs:
            scores = outputs[name]
            rows = scores.reshape(len(scores), -1) if pipeline.batched else scores.reshape(1, -1)
            top = _top(rows, count, specs[name])
            out[name] = top if pipeline.batched else top[0]
    return out


def _top(rows: np.ndarray, count: int, spec: OutputSpec) -> np.ndarray:
    """Each row's `count` highest scores (fewer if the row has fewer) as Triton's strings."""
    count = min(count, rows.shape[1])
    order = np.argsort(-rows, axis=1, kind="stable")[:, :count]
    labels = spec.labels or []
    out = np.empty(order.shape, dtype=object)
    for (row, rank), index in np.ndenumerate(order):
        label = f":{labels[index]}" if index < len(labels) else ""
        out[row, rank] = f"{float(rows[row, index]):f}:{index}{label}".encode()
    return out
