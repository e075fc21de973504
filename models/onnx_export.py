"""Export dense layers (weights, bias, ReLU between) to a small ONNX graph by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# Older ONNX Runtime releases refuse newer IR versions.
IR_VERSION = 9

Layer = tuple[np.ndarray, np.ndarray]


def dense_model(layers: Sequence[Layer], input_name: str, output_name: str) -> onnx.ModelProto:
    """`x @ W + b` per layer with ReLU between layers and none after the last (raw logits)."""
    nodes, initializers = [], []
    current = input_name
    for index, (weight, bias) in enumerate(layers):
        last = index == len(layers) - 1
        prefix = f"layer{index}"
        initializers += [
            numpy_helper.from_array(weight.astype(np.float32), f"{prefix}.weight"),
            numpy_helper.from_array(bias.astype(np.float32), f"{prefix}.bias"),
        ]
        product, summed = f"{prefix}.matmul", output_name if last else f"{prefix}.add"
        nodes += [
            helper.make_node("MatMul", [current, f"{prefix}.weight"], [product]),
            helper.make_node("Add", [product, f"{prefix}.bias"], [summed]),
        ]
        current = summed
        if not last:
            current = f"{prefix}.relu"
            nodes.append(helper.make_node("Relu", [summed], [current]))
    features, classes = layers[0][0].shape[0], layers[-1][0].shape[1]
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", classes])],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="strata-models",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """An in-process CPU session on the serialised model, as the inference service loads it."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
