"""A pipeline's steps run once at start on a request of its declared inputs, and what they
make held against every model version a route may call.

The wiring check (wiring.py) follows names, datatypes and ranks; only running the steps
shows the sizes: images left channels last (HWC) where the model takes them channels first
(CHW), a crop of the wrong size, and what a plugin step makes that does not say so. The
request is synthetic and of each input's declared type: a 640x480 JPEG for an input a
`decode` step reads, a sentence for other BYTES, zeros (within `range`) for numbers, one row,
and each variable dimension of moderate size. Each tensor made must have the datatype and
the size of every fixed dimension the model declares (-1 fits any); a mismatch is a
ValueError naming the pipeline, the step that made the tensor and the tensor, and the
service stops.

A step that refuses the synthetic request (a crop larger than the image, a vocabulary that
does not know the sentence) leaves the dry run unfinished: that is logged, and what the
steps make is then checked per request (a model refusing it is the server's fault, answered
FAILED_PRECONDITION).
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from strata.config import preprocess as c
from strata.config.pipelines import InputSpec, Pipeline
from strata.models.onnxsig import TensorInfo
from strata.plugins import Step
from strata.shapes import wiring
from strata.wire.codec import DTYPES, Arrays, datatype_of

log = logging.getLogger(__name__)

PHOTO = (640, 480)  # width, height: larger than the crops models usually take
SENTENCE = "Strata checks this pipeline when it starts."
# A variable dimension's size in the synthetic request (at most its max_shape); smaller where
# an input has more than two, so that the request stays small.
FEW_DIMENSIONS, SIZE, SMALL_SIZE = 2, 256, 16


@functools.cache
def photo_jpeg() -> bytes:
    """A small photo-like JPEG: a gradient down, one across, and a gray."""
    ramp = Image.linear_gradient("L")
    across = ramp.rotate(90).resize(PHOTO)
    image = Image.merge("RGB", (ramp.resize(PHOTO), across, Image.new("L", PHOTO, 128)))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def check(name: str, spec: Pipeline, steps: Sequence[tuple[str, Step]], root: Path) -> None:
    """Run `steps` on a synthetic request; ValueError where what they make does not fit a
    model version the pipeline's routes call (its first model, or its fallback)."""
    made = _run(name, steps, synthetic(spec))
    if made is None:
        return
    for model in spec.first_models():
        for version in wiring.versions(root, model.name, model.versions_called()):
            _hold(name, made, version)


def synthetic(spec: Pipeline) -> Arrays:
    """A request of one row of each declared input, of its type."""
    decoded = {s.input for s in spec.preprocess if isinstance(s, c.DecodeStep)}
    return {t.name: _tensor(t, t.name in decoded, spec.max_batch_size > 0) for t in spec.inputs}


def _tensor(spec: InputSpec, image: bool, batched: bool) -> np.ndarray:
    variable = sum(d == -1 for d in spec.shape[int(batched) :])
    size = SIZE if variable <= FEW_DIMENSIONS else SMALL_SIZE
    shape = [
        1 if batched and axis == 0 else (d if d != -1 else int(min(spec.limit(axis), size)))
        for axis, d in enumerate(spec.shape)
    ]
    if spec.datatype == "BYTES":
        item = photo_jpeg() if image else SENTENCE.encode()
        values = np.empty(shape, dtype=object)
        values.fill(item)
        return values
    value = 0.0 if spec.range is None else min(max(0.0, spec.range[0]), spec.range[1])
    return np.full(shape, value, dtype=DTYPES[spec.datatype])


def _run(
    name: str, steps: Sequence[tuple[str, Step]], tensors: Arrays
) -> dict[str, tuple[np.ndarray, str]] | None:
    """Each tensor the steps end with, and the step that last wrote it ("the client" for one
    passed on as it came); None where a step refused the synthetic request."""
    makers = dict.fromkeys(tensors, "the client")
    for label, step in steps:
        try:
            after = step.process(tensors)
        except Exception as exc:  # a plugin's too: the dry run only checks what it can
            log.info(
                "pipeline %s: the start-up dry run stopped at preprocess step %r, which "
                "refused a synthetic request (%s); what follows it is checked per request",
                name,
                label,
                exc,
            )
            return None
        for tensor, values in after.items():
            if values is not tensors.get(tensor):
                makers[tensor] = f"preprocess step {label!r}"
        tensors = after
    return {tensor: (values, makers[tensor]) for tensor, values in tensors.items()}


def _hold(name: str, made: dict[str, tuple[np.ndarray, str]], version: wiring.Version) -> None:
    """ValueError unless `made` has each input of `version`, of its datatype and sizes."""
    where = f"pipeline {name!r}"
    for info in version.inputs:
        if info.name not in made:
            given = "; ".join(f"{stage} gives {t!r}" for t, (_, stage) in sorted(made.items()))
            raise ValueError(
                f"{where}: {version.label} takes input {info.name!r}, which no preprocess step "
                f"makes ({given or 'preprocess gives nothing'})"
            )
        values, stage = made[info.name]
        datatype = datatype_of(values)
        if datatype != info.datatype:
            raise ValueError(
                f"{where}: {stage} gives {info.name!r} as {datatype}, but {version.label} "
                f"takes it as {info.datatype}"
            )
        if not _fits(values.shape, info.shape):
            raise ValueError(
                f"{where}: {stage} gives {info.name!r} of shape {list(values.shape)} from a "
                f"synthetic request, but {version.label} takes {list(info.shape)}"
                + _hint(values.shape, info)
            )


def _fits(shape: tuple[int, ...], wanted: tuple[int, ...]) -> bool:
    return len(shape) == len(wanted) and all(
        w in (-1, d) for d, w in zip(shape, wanted, strict=True)
    )


def _hint(shape: tuple[int, ...], info: TensorInfo) -> str:
    """Where the sizes are those of the other image layout, the step that turns it."""
    if len(shape) != 4 or len(info.shape) != 4:
        return ""
    last = (shape[0], shape[3], shape[1], shape[2])  # channels last, as channels first
    first = (shape[0], shape[2], shape[3], shape[1])
    if _fits(last, info.shape):
        return " (it takes channels first: a `layout` step with to: CHW turns them)"
    if _fits(first, info.shape):
        return " (it takes channels last: a `layout` step with to: HWC turns them)"
    return ""
