"""Which pipelines leave the tail of their image preprocessing to the model (the fold).

An image pipeline ends, after its crop, with `normalize` ((x * scale - mean) / std per
channel, to FP32) and usually `layout` (HWC -> CHW). Run in preprocess, they turn a 150 KB
UINT8 crop into 602 KB of FP32 that then crosses two hops (preprocess -> gateway ->
inference). Folded, preprocess stops before them and sends the UINT8 crop, and the inference
service runs them inside the model: it prepends (Transpose,) Cast, Mul and Add to its ONNX
graph at load (services/inference/fold.py), where ONNX Runtime runs them in C over the batch.

The fold is automatic, decided from the config alone, the same in every service: a pipeline
folds where its steps end with such a tail over UINT8 [batch, H, W, C] images (decoded, or
declared UINT8 by the client, then only resized, cropped or padded: steps that keep UINT8),
and every model it feeds first (its fallback's too) is fed only by pipelines folding alike
and by no later stage. Preprocess still checks the whole configured pipeline against the
model file at start (strata.shapes.wiring); only what it runs, and so what it sends, is shorter.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata.config import preprocess as c
from strata.config.pipelines import Pipeline

# Built-in steps that keep UINT8 images UINT8, and so keep them foldable.
_KEEPING = (c.CropStep, c.PadStep)


@dataclass(frozen=True)
class Fold:
    """A pipeline's normalize (and layout) tail as the model runs it."""

    source: str  # the UINT8 [batch, H, W, C] images preprocess sends
    target: str  # the model input the tail made of them
    gain: tuple[float, ...]  # per channel (or one for all): x * gain + bias
    bias: tuple[float, ...]
    channels_first: bool  # the tail ends with layout to CHW
    steps: int  # how many of the pipeline's last steps the model runs


def folds(pipelines: Mapping[str, Pipeline]) -> dict[str, Fold]:
    """The pipelines that fold, by name: each one's tail foldable, and every model it feeds
    first fed alike by every pipeline (a model takes one form of input)."""
    own = {name: f for name, spec in pipelines.items() if (f := tail(spec)) is not None}
    folding = set(own)
    while True:
        fed: dict[str, set[Fold | None]] = defaultdict(set)
        for name, spec in pipelines.items():
            first = spec.first_models()
            for model in first:
                fed[model.name].add(own[name] if name in folding else None)
            for model in spec.model_refs()[len(first) :]:
                fed[model.name].add(None)
        agreed = {
            name
            for name in folding
            if all(fed[m.name] == {own[name]} for m in pipelines[name].first_models())
        }
        if agreed == folding:
            return {name: own[name] for name in sorted(folding)}
        folding = agreed


def model_folds(pipelines: Mapping[str, Pipeline]) -> dict[str, Fold]:
    """The models that run a pipeline's folded tail, by name, with that tail."""
    return {
        model.name: fold
        for name, fold in folds(pipelines).items()
        for model in pipelines[name].first_models()
    }


def tail(spec: Pipeline) -> Fold | None:
    """The fold of the pipeline's own steps, where they end with a foldable tail."""
    if spec.max_batch_size == 0 or spec.sequence is not None or c.per_version(spec.preprocess):
        return None
    fold = _tail(spec.preprocess)
    if fold is None or not _uint8_images(spec, spec.preprocess[: -fold.steps], fold.source):
        return None
    forwarded = set(spec.forward_to_postprocess)
    touched = {s.input for s in spec.preprocess[-fold.steps :]} | {fold.target}
    return None if forwarded & touched else fold


def _tail(steps: Sequence[c.StepSpec]) -> Fold | None:
    """normalize (HWC) then layout to CHW, layout to CHW then normalize (CHW), or normalize
    (HWC) alone, at the end of the steps, each reading what the one before made."""
    last = steps[-1:]
    pair = steps[-2:] if len(steps) >= 2 else []
    match pair:
        case [c.NormalizeStep() as norm, c.LayoutStep(to="CHW") as lay] if (
            norm.layout == "HWC" and lay.input == norm.target
        ):
            return _fold(norm, norm.input, lay.target, True, 2)
        case [c.LayoutStep(to="CHW") as lay, c.NormalizeStep() as norm] if (
            norm.layout == "CHW" and norm.input == lay.target
        ):
            return _fold(norm, lay.input, norm.target, True, 2)
    match last:
        case [c.NormalizeStep(layout="HWC") as norm]:
            return _fold(norm, norm.input, norm.target, False, 1)
    return None


def _fold(norm: c.NormalizeStep, source: str, target: str, first: bool, steps: int) -> Fold:
    # As the normalize step computes it: in FP64, then FP32 (steps/channels.py).
    gain = tuple(norm.scale / s for s in norm.std)
    bias = tuple(-m / s for m, s in zip(norm.mean, norm.std, strict=True))
    return Fold(source, target, gain, bias, first, steps)


def _uint8_images(spec: Pipeline, steps: Sequence[c.StepSpec], name: str) -> bool:
    """Whether `name` is UINT8 [batch, H, W, C] after `steps`: made so by a decode or color
    step, or declared so, and changed since only by steps that keep UINT8."""
    for step in reversed(steps):
        target = getattr(step, "target", None)
        if isinstance(step, c.ResizeStep) and step.input == name:
            continue
        if isinstance(step, _KEEPING) and step.target == name:
            name = step.input
            continue
        if isinstance(step, c.DecodeStep | c.ColorStep) and step.target == name:
            return step.mode != "L"
        # A plugin may write anything.
        if target == name or getattr(step, "input", None) == name or _plugin(step):
            return False
    declared = {t.name: t for t in spec.inputs}.get(name)
    return declared is not None and declared.datatype == "UINT8" and len(declared.shape) == 4


def _plugin(step: c.StepSpec) -> bool:
    return isinstance(step, c.PluginStep)
