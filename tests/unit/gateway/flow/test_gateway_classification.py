"""Triton's classification extension at the gateway: the top classes of an FP output."""

from __future__ import annotations

import numpy as np
import pytest

from services.gateway.flow.classification import class_counts, classified
from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument
from strata.wire import codec


def pipeline(batched: bool = True) -> Pipeline:
    first = -1 if batched else 2
    return Pipeline(
        inputs=[{"name": "x", "datatype": "FP32", "shape": [first, 4]}],
        outputs=[
            {"name": "scores", "datatype": "FP32", "shape": [first, 4], "labels": ["a", "b"]},
            {"name": "label", "datatype": "BYTES", "shape": [first, 1]},
        ],
        model={"name": "m"},
    )


def asking(output: str, **parameter) -> codec.v2.ModelInferRequest:
    request = codec.build_request("p", {"x": np.zeros((2, 4), np.float32)})
    asked = request.outputs.add(name=output)
    for field, value in parameter.items():
        setattr(asked.parameters["classification"], field, value)
    return request


def test_each_row_answers_its_top_classes_with_labels_where_known() -> None:
    scores = np.array([[1.1, 3.3, 0.5, 2.4], [0.1, 0.2, 0.9, 0.3]], np.float32)
    counts = class_counts(asking("scores", int64_param=2), pipeline())
    out = classified({"scores": scores}, counts, pipeline())["scores"]
    assert out.shape == (2, 2)
    assert out.tolist() == [
        [b"3.300000:1:b", b"2.400000:3"],
        [b"0.900000:2", b"0.300000:3"],
    ]


def test_a_count_past_the_classes_answers_them_all() -> None:
    scores = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    counts = class_counts(asking("scores", int64_param=9), pipeline())
    assert classified({"scores": scores}, counts, pipeline())["scores"].shape == (1, 4)


def test_a_pipeline_without_a_batch_dimension_ranks_the_whole_tensor() -> None:
    scores = np.array([[1.0, 2.0, 3.0, 4.0], [8.0, 0.0, 0.0, 0.0]], np.float32)
    counts = class_counts(asking("scores", int64_param=2), pipeline(batched=False))
    out = classified({"scores": scores}, counts, pipeline(batched=False))["scores"]
    assert out.tolist() == [b"8.000000:4", b"4.000000:3"]


def test_outputs_not_asked_for_are_returned_as_they_are() -> None:
    scores = np.ones((1, 4), np.float32)
    assert class_counts(asking("scores"), pipeline()) == {}
    assert classified({"scores": scores}, {}, pipeline())["scores"] is scores


@pytest.mark.parametrize(
    ("output", "parameter", "words"),
    [
        ("label", {"int64_param": 1}, ["output 'label' is BYTES", "FP16, FP32, FP64"]),
        ("scores", {"int64_param": 0}, ["must be a positive integer"]),
        ("scores", {"string_param": "3"}, ["must be a positive integer"]),
    ],
)
def test_what_cannot_be_classified_is_refused(output, parameter, words) -> None:
    with pytest.raises(InvalidArgument) as refused:
        class_counts(asking(output, **parameter), pipeline())
    assert all(word in str(refused.value) for word in words)
