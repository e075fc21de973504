"""Sequences through a stateful pipeline, as tritonclient drives them on gRPC and HTTP: the
running total of models/accumulator.py kept per sequence by the inference replica that
holds it (two replicas here: a request that reached the other one would find no sequence),
in order, with its control inputs; refusals that leave a sequence as it was; and the limits,
the most sequences at once and the idle timeout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from models import accumulator
from strata.tools.launch import Supervisor
from tests.support.system import DEFAULT_CONFIG, endpoint, run_client, running_system

IDLE_SECONDS = 1.5
LIMIT = 4  # the gateway's for the pipeline: the report keeps up to 4 sequences live at once
SHIPPED = yaml.safe_load((DEFAULT_CONFIG.parent / "sequences.yaml").read_text())
# The demo pipeline of configs/sequences.yaml, on deployment b's two replicas, with limits
# a test can reach.
COUNTER = {
    **SHIPPED["pipelines"]["counter"],
    "model": {"name": "accumulator", "routes": [{"arm": "only", "deployment": "b"}]},
    "sequence": {
        "max_sequence_idle_microseconds": int(IDLE_SECONDS * 1e6),
        "max_sequences": LIMIT,
    },
}


def repository(folder: Path) -> Path:
    """The demo repository's models, and the accumulator with the test's idle timeout."""
    demo = DEFAULT_CONFIG.parent / yaml.safe_load(DEFAULT_CONFIG.read_text())["repository"]
    root = folder / "repository"
    root.mkdir()
    for model in ("digits", "tabular", "digits-large"):
        (root / model).symlink_to(demo.resolve() / model)
    accumulator.write(folder)
    manifest = root / accumulator.NAME / "model.yaml"
    config = yaml.safe_load(manifest.read_text())
    config["sequence"]["max_sequence_idle_microseconds"] = int(IDLE_SECONDS * 1e6)
    manifest.write_text(yaml.safe_dump(config))
    return root


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    folder = tmp_path_factory.mktemp("sequences")
    changes = {
        "repository": str(repository(folder)),
        "services": {"inference": {"b": endpoint(2)}},
        "inference": {"models": ["digits", "tabular", "digits-large", accumulator.NAME]},
        "pipelines": {"counter": COUNTER},
    }
    with running_system(folder, changes) as supervisor:
        yield supervisor


def run(system: Supervisor, *args: str) -> Any:
    gateway = system.settings.services.gateway
    return run_client("triton_sequences", gateway.listen, gateway.rest, "counter", "tabular", *args)


@pytest.fixture(scope="module")
def report(system: Supervisor) -> dict[str, Any]:
    return run(system)


def test_the_model_config_describes_the_sequence_batching(report: dict[str, Any]) -> None:
    for config in report["config"].values():
        batching = config["sequence_batching"]
        assert int(batching["max_sequence_idle_microseconds"]) == IDLE_SECONDS * 1e6
        assert "direct" in batching
        assert [i["name"] for i in config["input"]] == ["value"]  # no control nor state input
    assert {"sequence", "sequence(string_id)"} <= set(report["extensions"])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_interleaved_sequences_keep_their_own_totals(report: dict[str, Any], protocol: str) -> None:
    answers = report["interleaved"][protocol]
    for offset, (sequence, steps) in enumerate(answers.items()):
        scale = offset + 1
        assert [s["total"] for s in steps] == [scale * t for t in (1, 3, 6, 10)], sequence
        assert [s["controls"] for s in steps] == [[1, 0, 1], [0, 0, 1], [0, 0, 1], [0, 1, 1]]
        assert {s["corrid"] for s in steps} == {sequence}  # CORRID: the client's own id


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_refusals_name_what_was_wrong(report: dict[str, Any], protocol: str) -> None:
    refusals = report["refusals"][protocol]
    invalid = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
    expected = {
        "after_end": "is not active (never started, ended, or idle longer than 1500000 µs)",
        "unknown": "send its first request with sequence_start",
        "no_id": "pipeline 'counter' is stateful: each request belongs to a sequence",
        "stateless": "pipeline 'tabular' is stateless: it takes no sequence",
    }
    for case, words in expected.items():
        assert refusals[case]["status"] == invalid, (case, refusals[case])
        assert words in refusals[case]["message"], (case, refusals[case])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_bad_request_leaves_its_sequence_as_it_was(report: dict[str, Any], protocol: str) -> None:
    refusals = report["refusals"][protocol]
    invalid = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
    assert refusals["bad"]["datatype"]["status"] == invalid
    assert refusals["bad"]["rows"]["status"] == invalid
    assert "holds one row (batch 1)" in refusals["bad"]["rows"]["message"]
    assert refusals["after_bad"]["total"] == 6  # 5, then 1: the refused requests added nothing
    assert refusals["after_bad"]["controls"] == [0, 1, 1]


def test_requests_sent_together_on_a_stream_run_in_their_sequences_order(
    report: dict[str, Any],
) -> None:
    answers = report["streamed"]
    assert not [a for a in answers if "error" in a]
    by_sequence: dict[str, list[tuple[int, float]]] = {}
    for answer in answers:
        sequence, index = answer["id"].split(":")
        by_sequence.setdefault(sequence, []).append((int(index), answer["total"]))
    assert len(by_sequence) == 4
    for steps in by_sequence.values():
        assert sorted(steps) == [(i, i + 1) for i in range(5)]


def test_past_the_limit_a_sequence_is_refused_and_idle_ones_are_freed(
    system: Supervisor, report: dict[str, Any]
) -> None:
    """After the report: every sequence it started has ended."""
    limits = run(system, str(LIMIT), str(IDLE_SECONDS))
    assert limits["started"] == LIMIT
    refused = limits["past_limit"]
    assert refused["status"] == "429"
    assert "pipeline 'counter' holds 4 sequences, its most (max_sequences)" in refused["message"]
    expired = limits["expired"]
    assert expired["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "is not active" in expired["message"]
    assert limits["after_idle"]["total"] == 2
