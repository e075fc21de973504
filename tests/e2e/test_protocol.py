"""The v2 protocol's extensions as tritonclient uses them, on gRPC and HTTP: the model config
an image client acts on, classification, model repository control and system shared
memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.tools.launch import Supervisor
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


GATEWAY_TOKEN = "gateway-admin-token-for-the-e2e-tests-0123"
INFERENCE_TOKEN = "inference-admin-token-for-the-e2e-tests-0123"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("protocol")


@pytest.fixture(scope="module")
def system(folder: Path) -> Iterator[Supervisor]:
    changes = {
        "pipelines": {"photos": PHOTOS},
        "gateway": {"admin_token": GATEWAY_TOKEN, "shared_memory": {"enabled": True}},
        "inference": {"admin_token": INFERENCE_TOKEN},
    }
    with running_system(folder, changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def report(system: Supervisor) -> dict[str, Any]:
    gateway = system.settings.services.gateway
    return run_client("triton_protocol", gateway.listen, gateway.rest, GATEWAY_TOKEN)


def test_both_protocols_name_the_extensions(report: dict[str, Any]) -> None:
    for extensions in report["extensions"].values():
        assert {"classification", "model_configuration", "model_repository"} <= set(extensions)


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


def states(index: list[dict[str, str]], pipeline: str) -> dict[str, str]:
    """Each arm's (or the shadow's) state in a repository index, by its reason's prefix."""
    return {e["reason"].split(":")[0]: e["state"] for e in index if e["name"] == pipeline}


def test_the_index_lists_every_pipeline_with_the_versions_behind_its_arms(
    report: dict[str, Any],
) -> None:
    index = report["repository"]["index"]
    assert {e["name"] for e in index} == {"digits", "digits-cascade", "photos", "tabular"}
    digits = {e["reason"].split(":")[0]: e for e in index if e["name"] == "digits"}
    assert digits["arm control"]["version"] == "1" and digits["arm canary"]["version"] == "2"
    assert "on inference deployment b" in digits["arm canary"]["reason"]
    # A cascade lists its later stage's model too, under that stage's arms.
    cascade = {e["reason"].split(":")[0]: e for e in index if e["name"] == "digits-cascade"}
    assert set(cascade) == {"arm a", "stage large arm a"}
    assert "model digits-large version latest" in cascade["stage large arm a"]["reason"]
    assert all(e["state"] == "READY" for e in index)


def test_unload_and_load_reach_the_inference_deployments(report: dict[str, Any]) -> None:
    control = report["repository"]
    assert control["unload"]["status"] == "OK" and control["load"]["status"] == "OK"
    after = control["after_unload"]
    assert after["ready"] is False
    assert set(states(after["index"], "tabular").values()) == {"UNAVAILABLE"}
    assert set(states(after["index"], "digits").values()) == {"READY"}
    assert control["after_load"]["ready"] is True
    assert set(states(control["after_load"]["index"], "tabular").values()) == {"READY"}


def test_repository_control_needs_the_gateway_admin_token(report: dict[str, Any]) -> None:
    control = report["repository"]
    assert control["no_token"]["grpc"]["status"] == "StatusCode.UNAUTHENTICATED"
    assert control["no_token"]["http"]["status"] == "401"
    assert control["wrong_token"]["status"] == "StatusCode.UNAUTHENTICATED"
    assert "missing or wrong admin token" in control["wrong_token"]["message"]


def test_repository_control_refusals_name_what_was_wrong(report: dict[str, Any]) -> None:
    control = report["repository"]
    assert control["unknown"]["grpc"]["status"] == "StatusCode.NOT_FOUND"
    assert control["unknown"]["http"]["status"] == "404"
    assert "unknown model 'nope'" in control["unknown"]["http"]["message"]
    refused = control["with_config"]
    assert refused["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "load parameters are not supported" in refused["message"]


def test_log_settings_are_read_and_changed_with_the_admin_token(report: dict[str, Any]) -> None:
    settings = report["settings"]
    log = {key: next(iter(value.values())) for key, value in settings["log"].items()}
    assert log["log_info"] is True and log["log_file"] == "" and log["log_format"] == "json"
    assert settings["verbose"]["log_verbose_level"] == 1
    assert settings["back"]["log_verbose_level"] == {"uint32_param": 0}
    assert settings["no_token"]["status"] == "401"
    refused = settings["log_file"]
    assert refused["status"] == "StatusCode.INVALID_ARGUMENT" and "stderr" in refused["message"]


def test_trace_settings_are_read_and_say_why_they_cannot_change_here(
    report: dict[str, Any],
) -> None:
    """This system exports no traces (no OTLP endpoint); tests/e2e/test_tracing.py changes
    them where it does."""
    settings = report["settings"]
    assert settings["trace"]["trace_mode"] == {"value": ["opentelemetry"]}
    assert settings["trace"]["trace_rate"] == {"value": ["1"]}  # sample_ratio 1.0: every trace
    assert settings["trace"]["trace_level"] == {"value": ["OFF"]}  # but none goes anywhere
    assert settings["model_trace"]["trace_level"] == ["OFF"]
    assert settings["model_trace"]["trace_rate"] == "1"
    assert settings["trace_no_token"]["status"] == "401"
    refused = settings["trace_change"]
    assert refused["status"] == "503" and "no OTLP endpoint" in refused["message"]
    one_model = settings["trace_of_a_model"]
    assert one_model["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "trace settings are the server's" in one_model["message"]


def test_a_sequence_on_a_stateless_pipeline_is_refused(report: dict[str, Any]) -> None:
    refused = report["sequence"]
    assert refused["grpc"]["status"] == "StatusCode.INVALID_ARGUMENT"
    assert refused["http"]["status"] == "400"
    for answer in refused.values():
        assert (
            "is stateless: it takes no sequence (sequence_id, sequence_start)"
            in (answer["message"])
        )


@pytest.fixture(scope="module")
def shared(system: Supervisor) -> dict[str, Any]:
    gateway = system.settings.services.gateway
    return run_client("triton_shm", gateway.listen, gateway.rest)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_tensors_pass_through_shared_memory(shared: dict[str, Any], protocol: str) -> None:
    report = shared[protocol]
    assert report["status"] == ["in", "out"]
    assert report["scores"] == report["plain_scores"]  # the same bytes either way
    assert len(report["labels"]) == 2  # an output in the answer beside one in shared memory
    assert report["after_unregister"] == []


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cuda_regions_are_an_empty_registry(shared: dict[str, Any], protocol: str) -> None:
    """Triton's shm examples begin by unregistering every CUDA region: a gateway without GPU
    memory answers that, and the status of all of them, truthfully, and the client goes on."""
    report = shared[protocol]
    assert report["cuda_unregister_all"] == {"status": "OK", "value": None}
    assert report["cuda_status_all"] == {"status": "OK", "value": []}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_shared_memory_refusals_name_what_was_wrong(shared: dict[str, Any], protocol: str) -> None:
    report = shared[protocol]
    expected = {
        "past_the_region": ("INVALID_ARGUMENT", "400", "lie outside shared memory region 'in'"),
        "other_client": ("INVALID_ARGUMENT", "400", "no shared memory region 'in' is registered"),
        "twice": ("ALREADY_EXISTS", "409", "registered already"),
        "escape": ("INVALID_ARGUMENT", "400", "must be a name like /input0"),
        "missing": ("NOT_FOUND", "404", "no shared memory object '/strata_e2e_none'"),
        "too_big": ("INVALID_ARGUMENT", "400", "the region needs 4096"),
        "cuda_register": ("UNIMPLEMENTED", "501", "register system shared memory instead"),
        "cuda_status_one": ("UNIMPLEMENTED", "501", "register system shared memory instead"),
        "cuda_unregister_one": ("UNIMPLEMENTED", "501", "register system shared memory instead"),
    }
    for case, (code, status, words) in expected.items():
        answer = report[case]
        wanted = f"StatusCode.{code}" if protocol == "grpc" else status
        assert answer["status"] == wanted, (case, answer)
        assert words in answer["message"], (case, answer)
    assert report["other_status"] == []  # another client sees none of these regions


def test_an_unimplemented_call_is_answered_without_a_traceback(
    report: dict[str, Any], shared: dict[str, Any], folder: Path
) -> None:
    """Last: every call above (refusals included) has been made by now."""
    assert report["unimplemented"]["grpc"]["status"] == "StatusCode.UNIMPLEMENTED"
    for log in folder.glob("*.log"):
        assert "Traceback" not in log.read_text(errors="replace"), log.name
