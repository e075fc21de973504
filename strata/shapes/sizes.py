"""The sizes of what a pipeline's preprocess makes, read from its config alone.

The inference service runs no step, yet must tell whether a model version loaded after start
takes what preprocess makes (services/inference/rewiring.py). The built-in steps say their
output sizes in their options: a crop's height and width, a layout's order, a decode's mode,
a tokenizer's max_length where it pads to it. Each tensor is followed from the pipeline's
declared inputs through them; -1 is a size that varies with the request (a decoded photo's
height) or is not known. After a plugin step nothing is known of any tensor's sizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from strata.config import preprocess as c
from strata.config.pipelines import Pipeline
from strata.shapes.wiring import Sized as Made

ANY = -1
_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4, "BGR": 3}
# Steps whose output has the sizes of their input.
_KEEPING = (
    c.NormalizeTextStep,
    c.VocabularyStep,
    c.NormalizeStep,
    c.ScaleStep,
    c.ClipStep,
    c.CastStep,
    c.StandardizeStep,
)


def made(spec: Pipeline) -> dict[str, Made] | None:
    """Each tensor preprocess ends with, as far as its config says; None after a plugin
    step (a step that does not declare its sizes)."""
    tensors = {t.name: Made(tuple(t.shape), "the client") for t in spec.inputs}
    for step in spec.preprocess:
        if isinstance(step, c.PluginStep):
            return None
        _after(step, tensors)
    return tensors


def _after(step: c.StepSpec, tensors: dict[str, Made]) -> None:
    """`tensors` after `step`: what it writes added, what it consumes gone."""
    stage = f"preprocess step {step.label!r}"
    source = getattr(step, "input", "")
    before = tensors[source].sizes if source in tensors else ()
    if isinstance(step, c.TokenizeStep):
        for name in (step.input, step.pair):
            tensors.pop(name or "", None)
        length = step.max_length if step.padding == "max_length" else ANY
        for name in (step.input_ids, step.attention_mask, step.token_type_ids):
            if name:
                tensors[name] = Made((before[0] if before else ANY, length), stage)
        return
    target = getattr(step, "target", source)
    if not isinstance(step, c.NormalizeTextStep):  # the one step that keeps its input
        tensors.pop(source, None)
    tensors[target] = Made(_sizes(step, before), stage)


def _sizes(step: c.StepSpec, before: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes `step` makes of an input of sizes `before`."""
    batch = before[:1] or (ANY,)
    if isinstance(step, c.DecodeStep | c.ColorStep):
        height, width = _image(before)
        if isinstance(step, c.DecodeStep):
            height, width = step.height or ANY, step.width or ANY
        channels = _CHANNELS[step.mode]
        return (*batch, height, width) if step.mode == "L" else (*batch, height, width, channels)
    if isinstance(step, c.ResizeStep):
        fixed = step.shorter is None
        size = (step.height, step.width) if fixed else (ANY, ANY)
        return (*batch, *size, *before[3:])  # type: ignore[arg-type]
    if isinstance(step, c.CropStep):
        return (*batch, step.height, step.width, *before[3:])
    if isinstance(step, c.PadStep):
        height, width = _image(before)
        tall, wide = _plus(height, step.top + step.bottom), _plus(width, step.left + step.right)
        return (*batch, tall, wide, *before[3:])
    if isinstance(step, c.LayoutStep):
        return _layout(step.to, before)
    if isinstance(step, c.FlattenStep):
        rest = before[1:]
        return (*batch, ANY if ANY in rest else math.prod(rest))
    if isinstance(step, _KEEPING):
        return before
    return tuple(ANY for _ in before)


def _image(sizes: Sequence[int]) -> tuple[int, int]:
    return (sizes[1], sizes[2]) if len(sizes) >= 3 else (ANY, ANY)


def _plus(size: int, border: int) -> int:
    return ANY if size == ANY else size + border


def _layout(to: str, before: tuple[int, ...]) -> tuple[int, ...]:
    if len(before) == 3:  # grayscale [batch, H, W] gains its channel axis
        before = (*before, 1)
        return (before[0], 1, *before[1:3]) if to == "CHW" else before
    if len(before) != 4:
        return tuple(ANY for _ in before)
    batch, a, b, d = before
    return (batch, d, a, b) if to == "CHW" else (batch, b, d, a)
