"""Which pipelines leave their normalize (and layout) tail to the model: decided from the
config alone, the same in preprocess and inference (strata/shapes/folding.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.images import STEPS
from strata.config.pipelines import Pipeline
from strata.shapes.folding import folds, model_folds

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def image_pipeline(
    model: str = "vision", steps: list[dict] | None = None, **extra: Any
) -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}],
            "preprocess": steps or [{"kind": kind, **options} for kind, options in STEPS],
            "model": {"name": model},
            **extra,
        }
    )


def test_a_decoded_cropped_image_pipeline_folds_its_normalize_and_layout() -> None:
    (fold,) = folds({"images": image_pipeline()}).values()
    assert (fold.source, fold.target, fold.channels_first, fold.steps) == (
        "image",
        "image",
        True,
        2,
    )
    assert fold.gain == pytest.approx([1 / 255 / s for s in STD])
    assert fold.bias == pytest.approx([-m / s for m, s in zip(MEAN, STD, strict=True)])
    assert set(model_folds({"images": image_pipeline()})) == {"vision"}


def test_layout_first_and_normalize_alone_fold_too() -> None:
    head = [
        {"kind": "decode", "input": "image"},
        {"kind": "crop", "input": "image", "height": 4, "width": 4, "output": "crop"},
    ]
    norm = {"kind": "normalize", "input": "crop", "mean": [0.5], "std": [0.25]}
    first = [
        *head,
        {"kind": "layout", "input": "crop", "to": "CHW", "output": "x"},
        {**norm, "input": "x", "layout": "CHW"},
    ]
    alone = [*head, {**norm, "output": "pixels"}]
    got = folds({"a": image_pipeline(steps=first), "b": image_pipeline("other", steps=alone)})
    assert (got["a"].source, got["a"].target, got["a"].channels_first) == ("crop", "x", True)
    assert (got["b"].source, got["b"].target, got["b"].channels_first) == ("crop", "pixels", False)


@pytest.mark.parametrize(
    "change",
    [
        lambda steps: steps.insert(1, {"kind": "scale", "input": "image"}),  # FP32 from here
        lambda steps: steps.__setitem__(0, {"kind": "decode", "input": "image", "mode": "L"}),
        lambda steps: steps.insert(1, {"kind": "my_plugins.steps:Anything", "input": "other"}),
    ],
)
def test_a_tail_over_images_that_may_not_be_uint8_rgb_does_not_fold(change) -> None:
    steps = [{"kind": kind, **options} for kind, options in STEPS]
    change(steps)
    assert folds({"images": image_pipeline(steps=steps)}) == {}


def test_a_model_fed_by_a_pipeline_that_does_not_fold_is_folded_by_none() -> None:
    plain = [{"kind": kind, **options} for kind, options in STEPS[:3]]
    plain.append({"kind": "layout", "input": "image", "to": "CHW"})  # no normalize
    pipelines = {"folds": image_pipeline(), "plain": image_pipeline(steps=plain)}
    assert folds(pipelines) == {}
    fallback = {"fallback": {"model": {"name": "vision"}}}
    shared = {"folds": image_pipeline(), "other": image_pipeline("small", steps=plain, **fallback)}
    assert folds(shared) == {}


def test_a_tail_whose_tensors_go_on_to_postprocess_does_not_fold() -> None:
    forwarded = image_pipeline(forward_to_postprocess=["image"])
    assert folds({"images": forwarded}) == {}
