"""The v2 protocol's extensions as tritonclient uses them, on gRPC and HTTP: the model config
an image client acts on, and classification."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from strata.launch import Supervisor
from tests.support.system import run_client, running_system

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
PHOTOS = {
    "inputs": [{"name": "images", "datatype": "UINT8", "shape": [-1, 8, 8, 1], "format": "NHWC"}],
    "outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10], "labels": LABELS},
        {"name": "label", "datatype": "BYTES", "shape": [-1, 1]},
    ],
    "preprocess": [
        {"kind": "scale", "input": "images", "factor": 1 / 255},
        {"kind": "flatten", "input": "images", "output": "pixels"},
    ],
    "model": {"name": "digits", "version": "1"},
    "postprocess": [
        {"kind": "softmax", "input": "logits", "output": "probabilities"},
        {"kind": "topk", "input": "probabilities", "k": 1, "values": "top", "indices": "classes"},
        {
            "kind": "labels",
            "input": "classes",
            "output": "label",
            "file": "digits/model.yaml",
            "classes": 10,
            "classes_of": "logits",
        },
    ],
}


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {"pipelines": {"photos": PHOTOS}}
    with running_system(tmp_path_factory.mktemp("protocol"), changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def report(system: Supervisor) -> dict[str, Any]:
    gateway = system.settings.services.gateway
    return run_client("triton_protocol", gateway.listen, gateway.rest)


def test_both_protocols_name_the_extensions(report: dict[str, Any]) -> None:
    for extensions in report["extensions"].values():
        assert {"classification", "model_configuration", "binary_tensor_data"} <= set(extensions)


def test_an_image_client_reads_the_format_and_the_batch(report: dict[str, Any]) -> None:
    configs = report["config"]
    for config in (configs["grpc"], configs["http"], configs["http_versioned"]):
        assert config["max_batch_size"] == 64
        (images,) = config["input"]
        assert images["format"] == "FORMAT_NHWC" and images["data_type"] == "TYPE_UINT8"
        assert [int(d) for d in images["dims"]] == [8, 8, 1]
    assert configs["http"]["input"][0]["dims"] == [8, 8, 1]  # numbers, as Triton writes them
    assert "format" not in configs["grpc_tabular"]["input"][0]  # FORMAT_NONE: not an image
    unknown = configs["http_unknown"]
    assert unknown["status"] == "404" and "unknown model 'nope'" in unknown["message"]


def test_classification_answers_the_top_classes_of_each_row(report: dict[str, Any]) -> None:
    answers = report["classification"]
    assert answers["grpc"] == answers["http"]
    for row in answers["grpc"]:
        assert len(row) == 3
        parts = [item.split(":") for item in row]
        scores = [float(score) for score, _, _ in parts]
        assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
        assert all(LABELS[int(index)] == label for _, index, label in parts)


def test_classification_of_a_bytes_output_is_refused(report: dict[str, Any]) -> None:
    refused = report["classification"]["bytes_output"]
    assert refused["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "output 'label' is BYTES" in refused["message"]
