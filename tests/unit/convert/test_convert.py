"""`strata convert` on small PyTorch models built here: entries written, parity refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

torch = pytest.importorskip(
    "torch", reason="conversion needs PyTorch: install the convert extra (.[convert])"
)

from services.inference.validation import read_cases  # noqa: E402
from strata.command import main  # noqa: E402
from strata.convert.cli import EXIT_FAILED, EXIT_PARITY, convert_main  # noqa: E402
from strata.convert.factory import parse_decl  # noqa: E402
from strata.convert.pipeline import Options, convert  # noqa: E402
from strata.convert.source import (  # noqa: E402
    ConversionError,
    ParityError,
    Source,
    TensorDecl,
    random_samples,
)
from strata.convert.text import read_topics  # noqa: E402

FEATURES = [TensorDecl("features", "float32", ("batch", 6))]
LOGITS = [TensorDecl("logits", "float32", ("batch", 3))]


def mlp() -> torch.nn.Module:
    """A small classifier, seeded: 6 features -> 3 logits."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


class Branchy(torch.nn.Module):
    """Data-dependent control flow: tracing keeps only the branch the traced input took."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.sum() > 0:
            return features * 2
        return -features


def branchy() -> Branchy:
    return Branchy()


class MaskedMean(torch.nn.Module):
    """Token ids and a mask -> the mean of the unmasked tokens' embeddings."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).to(torch.float32)
        return (self.embedding(ids) * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def mlp_source() -> Source:
    samples = random_samples(FEATURES, [1, 4, 9])
    return Source(mlp(), FEATURES, LOGITS, samples, description="test mlp")


def sequence_source() -> Source:
    inputs = [TensorDecl(n, "int64", ("batch", "sequence")) for n in ("ids", "mask")]
    samples = random_samples(inputs, [1, 3, 5], int_high=2)
    for sample in samples:
        sample["ids"] = np.random.default_rng(1).integers(0, 50, sample["ids"].shape)
        sample["mask"][:, 0] = 1  # every row keeps at least one token
    outputs = [TensorDecl("pooled", "float32", ("batch", 8))]
    padding = {"ids": 0.0, "mask": 0.0}
    return Source(MaskedMean(), inputs, outputs, samples, "masked mean", padding=padding)


def test_a_small_model_becomes_a_repository_entry(tmp_path: Path) -> None:
    result = convert(mlp_source(), Options(name="tiny", repository=tmp_path))
    folder = tmp_path / "tiny" / "1"
    assert result.folder == folder and result.version == 1
    assert {p.name for p in folder.iterdir()} == {"model.onnx", "validation", "conversion.yaml"}
    manifest = yaml.safe_load((tmp_path / "tiny" / "model.yaml").read_text())
    assert manifest == {"platform": "onnxruntime_onnx", "max_batch_size": 64}
    (parity,) = result.parity
    assert parity.name == "logits" and parity.max_abs_diff <= 1e-5 and parity.rows == 14
    report = yaml.safe_load((folder / "conversion.yaml").read_text())
    assert report["parity"]["logits"]["max_abs_diff"] == parity.max_abs_diff
    assert report["optimiser"] == "onnxruntime basic"


def test_the_exported_graph_has_a_dynamic_batch_at_opset_17(tmp_path: Path) -> None:
    convert(mlp_source(), Options(name="tiny", repository=tmp_path))
    path = tmp_path / "tiny" / "1" / "model.onnx"
    graph = onnx.load(str(path))
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 17
    dims = graph.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", 6]
    features = np.random.default_rng(5).standard_normal((23, 6)).astype(np.float32)
    (logits,) = ort.InferenceSession(str(path)).run(None, {"features": features})
    with torch.inference_mode():
        want = mlp()(torch.from_numpy(features)).numpy()
    assert np.abs(logits - want).max() <= 1e-5


def test_validation_cases_hold_the_reference_outputs(tmp_path: Path) -> None:
    source = mlp_source()
    convert(source, Options(name="tiny", repository=tmp_path, cases=2))
    cases = read_cases(tmp_path / "tiny" / "1" / "validation")
    assert [c.name for c in cases] == ["case_000", "case_001"]
    for case, sample in zip(cases, source.samples, strict=False):
        assert np.array_equal(case.inputs["features"], sample["features"])
        with torch.inference_mode():
            want = mlp()(torch.from_numpy(sample["features"])).numpy()
        assert np.array_equal(case.outputs["logits"], want)
        assert (case.atol, case.rtol) == (1e-4, 0.0)


def test_sequence_axes_are_dynamic_and_padding_is_recorded(tmp_path: Path) -> None:
    result = convert(sequence_source(), Options(name="pool", repository=tmp_path))
    assert result.parity[0].max_abs_diff <= 1e-5
    manifest = yaml.safe_load((tmp_path / "pool" / "model.yaml").read_text())
    assert manifest["padding"] == {"ids": 0.0, "mask": 0.0}
    session = ort.InferenceSession(str(result.folder / "model.onnx"))
    ids = np.array([[3, 4, 5, 0, 0], [7, 8, 9, 10, 11]])
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    (batched,) = session.run(None, {"ids": ids, "mask": mask})
    (alone,) = session.run(None, {"ids": ids[:1, :3], "mask": mask[:1, :3]})
    assert np.abs(batched[0] - alone[0]).max() <= 1e-6


def test_int8_quantisation_writes_an_integer_graph_within_its_tolerance(tmp_path: Path) -> None:
    result = convert(mlp_source(), Options(name="tiny8", repository=tmp_path, precision="int8"))
    ops = {node.op_type for node in onnx.load(str(result.folder / "model.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}
    (parity,) = result.parity
    assert parity.min_cosine >= 0.97 and parity.max_abs_diff > 0
    assert result.report["precision"] == "int8" and result.report["per_channel"] is True


def test_a_broken_export_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    samples = [{"features": np.full((2, 6), sign, np.float32)} for sign in (1.0, -1.0, 3.0)]
    source = Source(branchy(), FEATURES, [TensorDecl("out", "float32", ("batch", 6))], samples, "x")
    with pytest.raises(ParityError) as caught:
        convert(source, Options(name="branchy", repository=tmp_path))
    message = str(caught.value)
    assert "out: max |diff| " in message and "max |diff| <= 0.0001" in message
    assert not (tmp_path / "branchy").exists()


def test_the_command_refuses_a_broken_export_with_its_own_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = [
        *("branchy", "--repository", str(tmp_path)),
        *(
            "--module",
            "tests.unit.convert.test_convert:branchy",
            "--input",
            "features:float32:batch,6",
        ),
    ]
    assert convert_main(argv) == EXIT_PARITY
    assert "refused, nothing written" in capsys.readouterr().err
    assert not (tmp_path / "branchy").exists()


def test_the_command_converts_a_module_from_a_factory(tmp_path: Path) -> None:
    argv = [
        *("tiny", "--repository", str(tmp_path), "--module", "tests.unit.convert.test_convert:mlp"),
        *("--input", "features:float32:batch,6", "--output", "logits:float32:batch,3"),
        *("--max-batch-size", "16", "--quantise", "int8", "--per-tensor"),
    ]
    assert convert_main(argv) == 0
    manifest = yaml.safe_load((tmp_path / "tiny" / "model.yaml").read_text())
    assert manifest["max_batch_size"] == 16
    report = yaml.safe_load((tmp_path / "tiny" / "1" / "conversion.yaml").read_text())
    assert report["per_channel"] is False
    assert report["source"] == "factory tests.unit.convert.test_convert:mlp"


def test_versions_are_immutable_unless_overwritten(tmp_path: Path) -> None:
    options = Options(name="tiny", repository=tmp_path, version=1)
    convert(mlp_source(), options)
    manifest = tmp_path / "tiny" / "model.yaml"
    manifest.write_text(manifest.read_text() + "session: {intra_op_threads: 2}\n")
    with pytest.raises(ConversionError, match="--overwrite"):
        convert(mlp_source(), options)
    second = convert(mlp_source(), Options(name="tiny", repository=tmp_path))
    assert second.version == 2
    assert yaml.safe_load(manifest.read_text())["session"] == {"intra_op_threads": 2}
    convert(mlp_source(), Options(name="tiny", repository=tmp_path, version=1, overwrite=True))
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == ["1", "2", "model.yaml"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"opset": 13}, "opset 13 is below 17"),
        ({"name": "../out"}, "must be letters"),
        ({"max_batch_size": 2}, "more rows than max_batch_size 2"),
        ({"optimise": "fast"}, "optimise must be one of"),
    ],
)
def test_bad_options_are_refused_clearly(tmp_path: Path, options: dict, words: str) -> None:
    with pytest.raises(ConversionError, match=words.replace("(", r"\(")):
        convert(mlp_source(), Options(**{"name": "tiny", "repository": tmp_path, **options}))
    assert not (tmp_path / "tiny").exists()


def test_tensor_declarations_parse() -> None:
    assert parse_decl("ids:int64:batch,sequence") == TensorDecl(
        "ids", "int64", ("batch", "sequence")
    )
    assert parse_decl("logits") == TensorDecl("logits", "float32", ("batch",))
    with pytest.raises(ConversionError, match="first dimension"):
        parse_decl("x:float32:4,batch")
    with pytest.raises(ConversionError, match="unknown dtype"):
        parse_decl("x:float99:batch")


def test_the_strata_command_has_a_convert_subcommand(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["convert", "tiny", "--repository", str(tmp_path), "--module", "nowhere:build"]
    assert main(argv) == EXIT_FAILED
    assert "cannot load 'nowhere:build'" in capsys.readouterr().err


def test_topic_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "topics.yaml"
    path.write_text("temperature: 0.1\nlabels:\n  - {name: a, description: about a}\n")
    topics = read_topics(path)
    assert (topics.labels, topics.descriptions, topics.temperature) == (["a"], ["about a"], 0.1)
    path.write_text("labels:\n  - {name: a}\n")
    with pytest.raises(ConversionError, match="needs a 'name' and a 'description'"):
        read_topics(path)
    path.write_text("temperature: 0\nlabels:\n  - {name: a, description: x}\n")
    with pytest.raises(ConversionError, match="temperature must be a positive number"):
        read_topics(path)


def test_the_report_records_the_graphs_own_shapes_not_the_declaration(tmp_path: Path) -> None:
    argv = [
        *("tiny", "--repository", str(tmp_path), "--module", "tests.unit.convert.test_convert:mlp"),
        *("--input", "features:float32:batch,6", "--output", "logits"),  # dims left out
    ]
    assert convert_main(argv) == 0
    report = yaml.safe_load((tmp_path / "tiny" / "1" / "conversion.yaml").read_text())
    assert report["inputs"] == {"features": "float32[batch, 6]"}
    assert report["outputs"] == {"logits": "float32[batch, 3]"}
