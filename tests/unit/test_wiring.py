"""A pipeline's wiring is checked at start against every model version a route may call:
preprocess and postprocess refuse to build a pipeline whose steps, rules or declared outputs
do not fit the model, naming pipeline, stage and tensor; what only a request can show is the
server's fault (FAILED_PRECONDITION), never the client's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from services.postprocess.engine import RuleEngine
from services.postprocess.rule_chain import build_chain
from services.preprocess.pipeline import build_pipeline
from strata.config.pipelines import Pipeline
from strata.config.postprocess import PostprocessSettings
from strata.errors import NotReady
from strata.models.onnxsig import TensorInfo
from strata.shapes import sizes
from strata.shapes.wiring import Sized, Version, check_same
from tests.unit.inference.test_inference_toymodels import _finish, dense, pooling_model

DECLARED = {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}
SOFTMAX = {"kind": "softmax", "input": "y", "output": "probabilities"}


def identity(name: str) -> onnx.ModelProto:
    """x FP32 [batch, 4] -> `name` FP32 [batch, 4]: a version that renames its output."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], [name])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4])],
    )
    return _finish(graph)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A repository with model `m`: version 1 maps x [batch, 4] to y [batch, 3]."""
    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    onnx.save(dense(0), folder / "model.onnx")
    return tmp_path


def pipeline(**overrides: Any) -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [DECLARED],
            "model": {"name": "m"},
            "postprocess": [SOFTMAX],
            **overrides,
        }
    )


def build_both(spec: Pipeline, root: Path) -> None:
    build_pipeline("p", spec, root)
    build_chain("p", spec, root, PostprocessSettings())


def test_a_pipeline_that_fits_its_model_builds(root: Path) -> None:
    build_both(pipeline(), root)
    cast = [{"kind": "cast", "input": "x", "datatype": "FP32"}, {"kind": "clip", "input": "x"}]
    with pytest.raises(ValueError, match="clip needs 'low'"):  # the config's own check first
        pipeline(preprocess=cast)
    build_both(pipeline(preprocess=[cast[0], {"kind": "scale", "input": "x"}]), root)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]},
            "pipeline 'p': model 'm' version 1 takes input 'x', which no preprocess step makes "
            r"\(preprocess ends with \['features'\]\)",
        ),
        (
            {"preprocess": [{"kind": "cast", "input": "x", "datatype": "INT64"}]},
            "pipeline 'p': preprocess step 'cast' gives 'x' as INT64, but model 'm' version 1 "
            "takes it as FP32",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2, 2]}]},
            "pipeline 'p': the client gives 'x' with 3 dimensions, but model 'm' version 1 "
            r"takes 2 \(\[-1, 4\]\)",
        ),
        (
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                    {"name": "extra", "datatype": "FP32", "shape": [-1]},
                ]
            },
            "pipeline 'p': the client gives 'extra', which model 'm' version 1 does not take",
        ),
        (
            {"preprocess": [{"kind": "scale", "input": "pixels"}]},
            "pipeline 'p': preprocess step 'scale' reads tensor 'pixels', which nothing before "
            "it makes",
        ),
        (  # a step that replaces its input writes its `output`, and its input is gone
            {"preprocess": [{"kind": "cast", "input": "x", "output": "z", "datatype": "FP32"}]},
            r"pipeline 'p': model 'm' version 1 takes input 'x', which no preprocess step makes "
            r"\(preprocess ends with \['z'\]\)",
        ),
    ],
)
def test_preprocess_that_does_not_end_with_the_models_inputs_stops_the_service(
    root: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_pipeline("p", pipeline(**overrides), root)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"postprocess": [{**SOFTMAX, "input": "logits"}]},
            r"pipeline 'p': postprocess rule 'softmax' \(with model 'm' version 1\) reads tensor "
            r"'logits', which nothing before it makes \(there: \['y'\]\)",
        ),
        (
            {"outputs": [DECLARED, {"name": "label", "datatype": "BYTES", "shape": [-1]}]},
            "pipeline 'p': declares output 'label', which neither the model nor any rule makes",
        ),
        (
            {"outputs": [{"name": "y", "datatype": "BYTES", "shape": [-1, 3]}], "postprocess": []},
            "pipeline 'p': model 'm' version 1 gives output 'y' as FP32, but the pipeline "
            "declares BYTES",
        ),
        (
            {"outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}], "postprocess": []},
            r"pipeline 'p': model 'm' version 1 gives output 'y' with 2 dimensions, but the "
            r"pipeline declares \[-1\]",
        ),
    ],
)
def test_rules_and_outputs_that_do_not_fit_the_model_stop_the_service(
    root: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_chain("p", pipeline(**overrides), root, PostprocessSettings())


def test_every_version_a_route_may_call_is_checked_and_only_those(root: Path) -> None:
    folder = root / "m" / "2"
    folder.mkdir()
    onnx.save(identity("z"), folder / "model.onnx")
    with pytest.raises(ValueError, match="with model 'm' version 2"):
        build_chain("p", pipeline(), root, PostprocessSettings())
    pinned = {"name": "m", "routes": [{"arm": "a", "deployment": "d", "version": "1"}]}
    build_chain("p", pipeline(model=pinned), root, PostprocessSettings())
    shadowed = {**pinned, "shadow": {"deployment": "d", "version": "2"}}
    with pytest.raises(ValueError, match="version 2"):
        build_chain("p", pipeline(model=shadowed), root, PostprocessSettings())


def test_a_plugin_that_says_what_it_makes_is_checked_and_one_that_does_not_is_trusted(
    root: Path,
) -> None:
    copy = {"kind": "tests.support.plugins:Copy", "name": "copy", "input": "x", "output": "w"}
    with pytest.raises(ValueError, match="preprocess step 'copy' gives 'w', which model 'm'"):
        build_pipeline("p", pipeline(preprocess=[copy]), root)
    with pytest.raises(ValueError, match="step 'copy' gives 'x' as INT64, but model 'm'"):
        wrong = {**copy, "output": "x", "datatype": "INT64"}
        build_pipeline("p", pipeline(preprocess=[wrong]), root)
    build_pipeline("p", pipeline(preprocess=[{**copy, "output": "x"}]), root)
    unknown = {"kind": "tests.support.plugins:Fragile", "input": "y"}
    build_chain(
        "p",
        pipeline(postprocess=[unknown, {**SOFTMAX, "input": "made"}]),
        root,
        PostprocessSettings(),
    )


def test_a_missing_model_folder_is_left_to_inference(tmp_path: Path) -> None:
    build_both(pipeline(), tmp_path)


def answer(spec: Pipeline, root: Path, tensors: dict) -> dict:
    settings = PostprocessSettings()
    engine = RuleEngine({"p": build_chain("p", spec, root, settings)}, settings)
    outputs, _ = asyncio.run(engine.run("p", tensors, {}))
    return outputs


def test_an_answer_unlike_the_declared_output_is_the_servers_fault(root: Path) -> None:
    y = np.zeros((1, 3), np.float32)
    assert answer(pipeline(), root, {"y": y})["probabilities"].shape == (1, 3)
    narrow = pipeline(outputs=[{**DECLARED, "shape": [-1, 2]}])
    with pytest.raises(
        NotReady,
        match=r"output 'probabilities' is FP32 \[1, 3\], but the "
        r"pipeline declares FP32 \[-1, 2\]",
    ):
        answer(narrow, root, {"y": y})
    with pytest.raises(NotReady, match="rule 'softmax' needs tensor 'y'"):
        answer(pipeline(), root, {"logits": y})


def test_a_built_in_rule_in_place_makes_a_new_tensor(tmp_path: Path) -> None:
    """mean_pool in place turns the model's tokens [batch, seq, 4] into [batch, 4]: what was
    known of the name before does not hold the pipeline's declaration against it."""
    folder = tmp_path / "pool" / "1"
    folder.mkdir(parents=True)
    onnx.save(pooling_model(), folder / "model.onnx")
    spec = Pipeline.model_validate(
        {
            "inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "mask", "datatype": "FP32", "shape": [-1, -1]},
            ],
            "outputs": [{"name": "tokens", "datatype": "FP32", "shape": [-1, 4]}],
            "model": {"name": "pool"},
            "postprocess": [{"kind": "mean_pool", "input": "tokens", "mask": "mask"}],
            "forward_to_postprocess": ["mask"],
        }
    )
    build_chain("p", spec, tmp_path, PostprocessSettings())
    with pytest.raises(ValueError, match="model 'pool' version 1 gives output 'tokens' with 3"):
        build_chain(
            "p", spec.model_copy(update={"postprocess": []}), tmp_path, PostprocessSettings()
        )


def tensor(name: str, datatype: str = "FP32", rank: int = 2) -> TensorInfo:
    return TensorInfo(name, datatype, (-1,) * rank, (None,) * rank)


WIRED = Version("model 'm' version 1", [tensor("x")], [tensor("y")])


@pytest.mark.parametrize(
    ("inputs", "outputs", "words"),
    [
        (
            [tensor("x", "INT64")],
            [tensor("y")],
            "version 2's input 'x' is INT64 of rank 2, not FP32",
        ),
        ([tensor("x", rank=3)], [tensor("y")], "input 'x' is FP32 of rank 3, not FP32 of rank 2"),
        ([tensor("x")], [tensor("z")], "has no output 'y' (its outputs: ['z'])"),
        ([tensor("x"), tensor("w")], [tensor("y")], "has input 'w', which model 'm' version 1"),
    ],
)
def test_a_later_version_must_take_and_give_what_was_wired(
    inputs: list, outputs: list, words: str
) -> None:
    new = Version("model 'm' version 2", inputs, outputs)
    with pytest.raises(ValueError) as info:
        check_same("p", [WIRED], new)
    assert str(info.value).startswith("pipeline 'p': its steps and rules were checked at start")
    assert words in str(info.value)


def test_a_later_version_fits_when_it_matches_any_version_wired() -> None:
    other = Version("model 'm' version 0", [tensor("a")], [tensor("b")])
    check_same("p", [other, WIRED], Version("model 'm' version 2", [tensor("x")], [tensor("y")]))
    check_same("p", [], Version("model 'm' version 2", [tensor("q")], []))  # nothing wired


def shaped(name: str, *shape: int) -> TensorInfo:
    return TensorInfo(name, "FP32", shape, (None,) * len(shape))


IMAGE = Pipeline.model_validate(
    {
        "inputs": [{"name": "photo", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}],
        "preprocess": [
            {"kind": "decode", "input": "photo", "output": "images"},
            {"kind": "resize", "input": "images", "shorter": 256},
            {"kind": "crop", "input": "images", "height": 224, "width": 224},
            {"kind": "normalize", "input": "images", "mean": [0.5], "std": [0.2]},
            {"kind": "layout", "input": "images", "to": "CHW"},
        ],
        "model": {"name": "m"},
    }
)
CHW = Version("model 'm' version 1", [shaped("images", -1, 3, 224, 224)], [shaped("y", -1, 10)])


def test_the_sizes_preprocess_makes_are_read_from_the_built_in_steps_config() -> None:
    made = sizes.made(IMAGE)
    assert made == {"images": Sized((-1, 3, 224, 224), "preprocess step 'layout'")}
    without_crop = IMAGE.model_copy(update={"preprocess": IMAGE.preprocess[:2]})
    assert sizes.made(without_crop)["images"].sizes == (-1, -1, -1, 3)  # a photo's varies
    plugin = {"kind": "tests.support.plugins:Shrink", "input": "images", "poison": 1.0}
    assert (
        sizes.made(Pipeline.model_validate({**IMAGE.model_dump(), "preprocess": [plugin]})) is None
    )


@pytest.mark.parametrize(
    ("inputs", "outputs", "words"),
    [
        (  # channels last where the pipeline's layout step makes them first
            [shaped("images", -1, 224, 224, 3)],
            [shaped("y", -1, 10)],
            "version 2 takes input 'images' as [-1, 224, 224, 3], but preprocess step 'layout' "
            "gives it as [-1, 3, 224, 224]",
        ),
        (
            [shaped("pixels", -1, 3, 224, 224)],
            [shaped("y", -1, 10)],
            "has no input 'images' (its inputs: ['pixels'])",
        ),
        (
            [shaped("images", -1, 3, 224, 224)],
            [shaped("y", -1, 12)],
            "gives output 'y' as [-1, 12], but model 'm' version 1 gave it as [-1, 10]",
        ),
    ],
)
def test_a_later_version_must_take_the_sizes_preprocess_makes(
    inputs: list, outputs: list, words: str
) -> None:
    new = Version("model 'm' version 2", inputs, outputs)
    with pytest.raises(ValueError, match="pipeline 'p': its steps and rules were checked") as info:
        check_same("p", [CHW], new, sizes.made(IMAGE))
    assert words in str(info.value)


def test_a_size_a_later_version_fixes_must_be_known_to_be_made() -> None:
    loose = Version("model 'm' version 1", [shaped("images", -1, 3, -1, -1)], [shaped("y", -1, 10)])
    fixed = Version(
        "model 'm' version 2", [shaped("images", -1, 3, 224, 224)], [shaped("y", -1, 10)]
    )
    check_same("p", [loose], fixed, sizes.made(IMAGE))  # the crop makes 224 x 224
    check_same("p", [CHW], fixed)  # the version checked at start took 224 x 224
    with pytest.raises(ValueError, match=r"but preprocess gives it as \[-1, 3, -1, -1\]"):
        check_same("p", [loose], fixed)  # neither the config nor start shows 224 x 224
    open_sizes = Version(
        "model 'm' version 3", [shaped("images", -1, 3, -1, -1)], [shaped("y", -1, -1)]
    )
    check_same("p", [CHW], open_sizes, sizes.made(IMAGE))  # takes any size: fits
