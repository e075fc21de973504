"""A preprocess pipeline: the validation step, then the configured steps, in order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from opentelemetry import trace

from services.preprocess import dry_run, wiring
from services.preprocess.metrics import StepTimings
from services.preprocess.steps import Step, build_step
from services.preprocess.steps.decode import Decode
from services.preprocess.steps.image import Crop, Resize, ResizeAhead
from services.preprocess.steps.ragged import is_ragged, refuse
from services.preprocess.steps.validate import Validate
from strata.config.pipelines import Pipeline
from strata.errors import NotFound
from strata.telemetry.tracing import shapes
from strata.wire.codec import Arrays


@dataclass
class PreprocessPipeline:
    """Named steps run in order, each one timed."""

    name: str
    steps: list[tuple[str, Step]]
    timings: StepTimings = field(default_factory=StepTimings)

    def __post_init__(self) -> None:
        _resize_in_decode(self.steps)

    def for_version(self, version: str) -> PreprocessPipeline:
        """The same steps whatever the model version (see versions.py for those that vary)."""
        return self

    def run(self, tensors: Arrays) -> Arrays:
        """The steps in order. Each step's time goes to the metrics and, where the request's
        span is recorded, into its `strata.steps` attribute: a span per step would cost more
        than most steps."""
        span = trace.get_current_span()
        timed: list[str] | None = [] if span.is_recording() else None
        try:
            for label, step in self.steps:
                _check_ragged(label, step, tensors)
                start = time.perf_counter()
                try:
                    tensors = step.process(tensors)
                finally:
                    seconds = time.perf_counter() - start
                    self.timings.record(self.name, label, seconds)
                    if timed is not None:
                        timed.append(f"{label} {seconds * 1000:.3f} ms")
        finally:
            if timed is not None:
                span.set_attribute("strata.steps", timed)
        if timed is not None:
            span.set_attribute("strata.output_shapes", shapes(tensors))
        for name, values in tensors.items():
            if is_ragged(values):
                raise refuse(name, "the model")
        return tensors


def _resize_in_decode(steps: list[tuple[str, Step]]) -> None:
    """A decode of encoded images followed by a resize of what it decoded resizes each image
    before its pixels leave Pillow (the same pixels, about 0.5 ms less a 640x480 photo);
    the resize step then passes them on. Where a crop of the same images follows the resize,
    the decode resizes only the crop's window (about 0.9 ms less a 640x480 photo, bilinear:
    steps/image.py, ResizeAhead)."""
    found = [step for _, step in steps]
    for index in range(len(found) - 1):
        first, second = found[index], found[index + 1]
        third = found[index + 2] if index + 2 < len(found) else None
        if (
            isinstance(first, Decode)
            and isinstance(second, Resize)
            and first.options.height is None
            and second.options.input == first.options.target
        ):
            crop = (
                third
                if isinstance(third, Crop)
                and second.options.crop_window
                and third.options.input == second.options.input
                else None
            )
            first.ahead = ResizeAhead(second, crop)
            second.done_in_decode = crop is not None
            if crop is not None:
                crop.done_in_decode = True


def _check_ragged(label: str, step: Step, tensors: Arrays) -> None:
    """Refuse a ragged batch of images to a step that takes one size only."""
    # A built-in (and a plugin built from options of that shape) names its input there.
    name = getattr(getattr(step, "options", None), "input", None)
    if getattr(step, "takes_ragged", False) or not isinstance(name, str):
        return
    values = tensors.get(name)
    if values is not None and is_ragged(values):
        raise refuse(name, f"step {label!r}")


def build_pipeline(
    name: str,
    spec: Pipeline,
    repository: Path,
    timings: StepTimings | None = None,
    folded: int = 0,
) -> PreprocessPipeline:
    """Build every step once; stateful steps load their files here, not per request. The
    last `folded` steps are the model's to run (strata/shapes/folding.py): checked with the others
    against the model file, never run here."""
    steps: list[tuple[str, Step]] = [("validate", Validate(spec.inputs, spec.max_batch_size))]
    for stage in spec.preprocess:
        where = f"pipeline {name!r}: preprocess step {stage.label!r}"
        if any(label == stage.label for label, _ in steps):
            raise ValueError(f"{where}: the name is taken; give the step a distinct 'name'")
        try:
            steps.append((stage.label, build_step(stage, repository)))
        except (ValueError, OSError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
    built = [step for _, step in steps[1:]]
    wiring.check(name, spec, list(zip(spec.preprocess, built, strict=True)), repository)
    dry_run.check(name, spec, steps, repository)
    run = steps[: len(steps) - folded]
    return PreprocessPipeline(name=name, steps=run, timings=timings or StepTimings())


class Versions(Protocol):
    """A pipeline as each model version is fed."""

    def for_version(self, version: str) -> PreprocessPipeline: ...


class PreprocessPipelines:
    """All pipelines of the deployment, looked up by name and model version per request."""

    def __init__(self, pipelines: dict[str, Versions]) -> None:
        self._pipelines = pipelines

    def get(self, name: str, version: str = "") -> PreprocessPipeline:
        try:
            found = self._pipelines[name]
        except KeyError:
            raise NotFound(f"unknown pipeline {name!r}") from None
        return found.for_version(version)
