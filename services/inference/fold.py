"""A pipeline's normalize (and layout) tail run inside its model (strata/shapes/folding.py).

At load, a copy of the model's graph in memory gains the pipeline's tail in front of the input
it feeds: the new graph input is the UINT8 [batch, H, W, C] images preprocess sends, under the
name it sends them; where the tail has layout, Transpose to [batch, C, H, W] first, on the
UINT8 pixels (on FP32 it cost ONNX Runtime ten times as much), then Cast to FP32, Mul by the
gain and Add the bias per channel (the normalize step's own arithmetic, in its order) make the
tensor the graph took before, now an inner one. ONNX Runtime runs them in C over the whole
batch. The file on disk is never changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from strata.errors import NotReady
from strata.shapes.folding import Fold

_PREFIX = "strata_fold"


def folded(path: Path, fold: Fold) -> bytes:
    """The model at `path` with `fold` in front of its input `fold.target`, serialised.
    NotReady where the model cannot take it: no such input, or not FP32 images of rank 4."""
    model = onnx.load(str(path))
    graph = model.graph
    where = f"{path.parent.parent.name}/{path.parent.name}/{path.name}"
    index = next((i for i, v in enumerate(graph.input) if v.name == fold.target), None)
    if index is None:
        raise NotReady(f"{where} has no input {fold.target!r}, which the pipeline's tail feeds")
    original = graph.input[index]
    tensor = original.type.tensor_type
    if tensor.elem_type != TensorProto.FLOAT or len(tensor.shape.dim) != 4:
        raise NotReady(
            f"{where}: input {fold.target!r} is not FP32 images of rank 4, which the "
            "pipeline's normalize step makes"
        )
    if fold.source != fold.target and any(v.name == fold.source for v in graph.input):
        raise NotReady(f"{where} already has an input {fold.source!r}")
    if any(v.name == fold.target for v in graph.output):
        raise NotReady(f"{where} gives its input {fold.target!r} back as an output")
    inner = f"{_PREFIX}_{fold.target}"
    _rename(graph, fold.target, inner)
    dims = list(tensor.shape.dim)
    if fold.channels_first:
        dims = [dims[0], dims[2], dims[3], dims[1]]
    images = helper.make_tensor_value_info(
        fold.source, TensorProto.UINT8, [d.dim_param or d.dim_value or None for d in dims]
    )
    graph.input.remove(original)
    graph.input.insert(index, images)
    # Per channel, on the channel axis: [C, 1, 1] after the Transpose, [C] (the last) without.
    axes = (-1, 1, 1) if fold.channels_first else (-1,)
    graph.initializer.extend(
        [
            numpy_helper.from_array(_per_channel(fold.gain, axes), f"{_PREFIX}_gain"),
            numpy_helper.from_array(_per_channel(fold.bias, axes), f"{_PREFIX}_bias"),
        ]
    )
    for position, node in enumerate(_nodes(fold, inner)):
        graph.node.insert(position, node)
    try:
        return model.SerializeToString()
    except ValueError as exc:  # protobuf's 2 GB limit
        raise NotReady(f"{where} cannot be folded in memory: {exc}") from None


def _nodes(fold: Fold, inner: str) -> list[onnx.NodeProto]:
    # The Transpose first, on the UINT8 pixels: a quarter of the bytes FP32 would move.
    pixels = fold.source
    nodes = []
    if fold.channels_first:
        pixels = f"{_PREFIX}_chw"
        nodes.append(helper.make_node("Transpose", [fold.source], [pixels], perm=[0, 3, 1, 2]))
    return [
        *nodes,
        helper.make_node("Cast", [pixels], [f"{_PREFIX}_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [f"{_PREFIX}_float", f"{_PREFIX}_gain"], [f"{_PREFIX}_scaled"]),
        helper.make_node("Add", [f"{_PREFIX}_scaled", f"{_PREFIX}_bias"], [inner]),
    ]


def _per_channel(values: tuple[float, ...], where: tuple[int, ...]) -> np.ndarray:
    return np.asarray(values, np.float32).reshape(where)


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every use of `old` in the graph and the graphs inside its nodes (which may read an
    outer tensor by name) becomes `new`."""
    for node in _all_nodes(graph):
        node.input[:] = [new if name == old else name for name in node.input]


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for inner in [attribute.g, *attribute.graphs]:
                yield from _all_nodes(inner)
