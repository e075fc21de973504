"""Statistics that travel with the model version: a pipeline whose standardize step reads
`tabular/{version}/stats.json` feeds each version its own statistics, beside each other in
one pipeline (version 1 on arm control, version 2 on arm canary), checks each against the
fingerprint model.yaml records for that version at start and after a hot swap, and never
feeds a version statistics that do not match."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from services.preprocess.app import build_pipelines
from services.preprocess.metrics import StepTimings
from services.preprocess.pipeline import PreprocessPipelines
from strata.config import ConfigError, load_settings
from strata.errors import InvalidArgument, NotReady
from strata.models.normalisation import STATS_FILE, Stats, load_stats, save_stats
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.inprocess import InProcess, servers_in_process
from tests.support.system import DEFAULT_CONFIG, make_config

BUILT = (DEFAULT_CONFIG.parent / "../build/repository").resolve()
PER_VERSION = {
    "kind": "standardize",
    "input": "features",
    "stats": "tabular/{version}/stats.json",
    "model_yaml": "tabular/model.yaml",
}
ARMS = [
    {"arm": "control", "deployment": "a", "version": "1", "weight": 50},
    {"arm": "canary", "deployment": "b", "version": "2", "weight": 50},
]
CHANGES = {
    "preprocess": {"version_check_seconds": 0},
    "pipelines": {"tabular": {"preprocess": [PER_VERSION], "model": {"routes": ARMS}}},
}


def other_stats(stats: Stats, shift: float) -> Stats:
    """Statistics a retrained version might have: shifted and wider."""
    return Stats(mean=stats.mean + shift * stats.std, std=stats.std * (1 + shift))


def repository(root: Path) -> tuple[Path, dict[str, Stats]]:
    """digits (and digits-large) as built; tabular version 1 as built and version 2 (the
    same graph) trained with other statistics, each version's in its folder and recorded in
    model.yaml."""
    root.mkdir()
    for model in ("digits", "digits-large"):  # digits-large: the default config's cascade
        (root / model).symlink_to(BUILT / model)
    shutil.copytree(BUILT / "tabular" / "1", root / "tabular" / "1")
    shutil.copytree(BUILT / "tabular" / "1", root / "tabular" / "2")
    stats = {"1": load_stats(root / "tabular" / "1" / STATS_FILE)}
    stats["2"] = other_stats(stats["1"], 0.5)
    save_stats(stats["2"], root / "tabular" / "2" / STATS_FILE)
    record(root, {v: s.fingerprint for v, s in stats.items()})
    return root, stats


def record(root: Path, prints: dict[str, str]) -> None:
    manifest = yaml.safe_load((BUILT / "tabular" / "model.yaml").read_text())
    manifest |= {"version_policy": {"all": True}, "preprocess_fingerprint": prints}
    (root / "tabular" / "model.yaml").write_text(yaml.safe_dump(manifest))


def swap_stats(root: Path, version: str, stats: Stats, stamp: int) -> None:
    path = root / "tabular" / version / STATS_FILE
    save_stats(stats, path)
    os.utime(path, ns=(stamp, stamp))  # a new stamp whatever the clock's resolution


def pipelines(folder: Path, root: Path, changes: dict | None = None) -> PreprocessPipelines:
    settings = load_settings(
        make_config(folder, {**CHANGES, "repository": str(root), **(changes or {})})
    )
    return build_pipelines(settings, StepTimings())


def standardized(pipes: PreprocessPipelines, version: str, x: np.ndarray) -> np.ndarray:
    return pipes.get("tabular", version).run({"features": x})["features"]


def expected(stats: Stats, x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.float64) - stats.mean) / stats.std).astype(np.float32)


def features(stats: Stats, rows: int = 4) -> np.ndarray:
    noise = np.random.default_rng(7).normal(size=(rows, stats.mean.size))
    return (stats.mean + noise * stats.std).astype(np.float32)


def test_each_version_is_fed_its_own_statistics(tmp_path: Path) -> None:
    root, stats = repository(tmp_path / "repository")
    pipes = pipelines(tmp_path, root)
    x = features(stats["1"])
    for version in ("1", "2"):
        np.testing.assert_allclose(standardized(pipes, version, x), expected(stats[version], x))
    with pytest.raises(InvalidArgument, match="must name the version in its 'model_version'"):
        pipes.get("tabular", "")


def test_a_version_whose_statistics_do_not_match_stops_the_start(tmp_path: Path) -> None:
    root, stats = repository(tmp_path / "repository")
    swap_stats(root, "2", stats["1"], 10**18)
    with pytest.raises(ValueError, match="version 2") as refused:
        pipelines(tmp_path, root)
    assert f"fingerprint {stats['1'].fingerprint}" in str(refused.value)


def test_a_hot_swap_is_checked_and_a_bad_one_keeps_the_statistics_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, stats = repository(tmp_path / "repository")
    pipes = pipelines(tmp_path, root)
    x = features(stats["1"])
    retrained = other_stats(stats["1"], 2.0)
    swap_stats(root, "2", retrained, 10**18)
    record(root, {"1": stats["1"].fingerprint, "2": retrained.fingerprint})
    np.testing.assert_allclose(standardized(pipes, "2", x), expected(retrained, x))
    swap_stats(root, "2", stats["1"], 2 * 10**18)  # not what model.yaml records
    np.testing.assert_allclose(standardized(pipes, "2", x), expected(retrained, x))
    assert "keeps the files it was built from before" in caplog.text
    np.testing.assert_allclose(standardized(pipes, "1", x), expected(stats["1"], x))


def test_a_version_first_asked_for_later_is_built_then_or_refused(tmp_path: Path) -> None:
    root, stats = repository(tmp_path / "repository")
    pipes = pipelines(tmp_path, root)
    with pytest.raises(NotReady, match="model 'tabular' has no version 3 in the repository"):
        pipes.get("tabular", "3")
    shutil.copytree(root / "tabular" / "2", root / "tabular" / "3")
    with pytest.raises(NotReady, match="no preprocess_fingerprint for version 3") as refused:
        pipes.get("tabular", "3")
    assert str(root) not in str(refused.value)
    prints = {v: s.fingerprint for v, s in stats.items()}
    record(root, {**prints, "3": stats["2"].fingerprint})
    x = features(stats["1"])
    np.testing.assert_allclose(standardized(pipes, "3", x), expected(stats["2"], x))
    with pytest.raises(InvalidArgument, match="must be 1 to 18 digits"):
        pipes.get("tabular", "../1")


@pytest.mark.parametrize(
    ("model", "step", "message"),
    [
        (
            {"routes": [{**ARMS[0], "version": ""}, ARMS[1]]},
            {},
            "every route must name its version",
        ),
        (
            {"routes": ARMS, "shadow": {"deployment": "b", "version": "2"}},
            {},
            "its shadow gets the inputs prepared for the request's arm",
        ),
        ({"routes": ARMS}, {"model_yaml": None, "fingerprint": "sha256:0"}, "give model_yaml"),
    ],
)
def test_per_version_files_need_versions_the_gateway_can_name(
    tmp_path: Path, model: dict, step: dict, message: str
) -> None:
    changes = {"pipelines": {"tabular": {"preprocess": [{**PER_VERSION, **step}], "model": model}}}
    with pytest.raises(ConfigError, match=message):
        load_settings(make_config(tmp_path, changes))


# Through the chain: the gateway tells preprocess the version of the request's arm.


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcess, dict]]:
    folder = tmp_path_factory.mktemp("versions")
    root, stats = repository(folder / "repository")
    with servers_in_process(folder, {**CHANGES, "repository": str(root)}) as world:
        yield world, stats


def scores(world: InProcess, arm: str, x: np.ndarray) -> tuple[np.ndarray, str]:
    stub = v2_grpc.GRPCInferenceServiceStub(
        grpc.insecure_channel(world.settings.services.gateway.listen)
    )
    request = codec.build_request("tabular", {"features": x})
    request.parameters["strata.arm"].string_param = arm
    reply = stub.ModelInfer(request, timeout=10)
    return codec.response_outputs(reply)["score"], reply.model_version


def top_probability(stats: Stats, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(BUILT / "tabular" / "1" / "model.onnx"))
    (logits,) = session.run(None, {"features": expected(stats, x)})
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True)).max(axis=1, keepdims=True)


def test_the_canary_is_fed_its_own_statistics_beside_the_control(world) -> None:
    world, stats = world
    x = features(stats["1"], rows=6)
    for arm, version in (("control", "1"), ("canary", "2")):
        score, answered = scores(world, arm, x)
        assert answered == version
        np.testing.assert_allclose(score, top_probability(stats[version], x), atol=1e-5)
    assert not np.allclose(top_probability(stats["1"], x), top_probability(stats["2"], x))


def test_a_tokenizer_may_be_the_versions_own(tmp_path: Path) -> None:
    raw = yaml.safe_load((DEFAULT_CONFIG.parent / "text.yaml").read_text())
    raw["repository"] = str(BUILT)
    embed = raw["pipelines"]["embed"]
    raw["pipelines"] = {"embed": embed}
    raw["inference"]["models"] = ["minilm"]
    (tokenize,) = [step for step in embed["preprocess"] if step["kind"] == "tokenize"]
    shared = build_pipelines(settings_at(tmp_path / "shared.yaml", raw), StepTimings())
    tokenize["tokenizer"] = "minilm/{version}/tokenizer.json"
    embed["model"]["version"] = "1"
    versioned = build_pipelines(settings_at(tmp_path / "versioned.yaml", raw), StepTimings())
    text = {"text": np.array([b"a version's own vocabulary", b"hello"], dtype=object)}
    ours = versioned.get("embed", "1").run(dict(text))
    for name, tensor in shared.get("embed").run(dict(text)).items():
        np.testing.assert_array_equal(ours[name], tensor)


def settings_at(path: Path, raw: dict):
    path.write_text(yaml.safe_dump(raw))
    return load_settings(path)
