"""What each preprocess step reads and makes, followed from the pipeline's declared inputs
to the model's inputs and checked against every model version a route may call (and every
version of the model's fallback)
(strata.shapes.wiring), when the service starts."""

from __future__ import annotations

from pathlib import Path

from strata.config import preprocess as c
from strata.config.pipelines import Pipeline
from strata.plugins import Made, Step
from strata.shapes import wiring
from strata.shapes.wiring import Flow

# Steps that replace their input with an output of another kind: (datatype, rank) of the
# output, None where it keeps the input's.
_REPLACING: dict[type, tuple[str | None, int | None]] = {
    c.VocabularyStep: ("INT64", None),
    c.CastStep: (None, None),
    c.FlattenStep: (None, 2),
    c.CropStep: (None, None),
    c.PadStep: (None, None),
    c.NormalizeStep: ("FP32", None),
    # Grayscale [batch, H, W] gains its channel axis.
    c.LayoutStep: (None, 4),
}
# Steps that change their input in place: the same.
_IN_PLACE: dict[type, tuple[str | None, int | None]] = {
    c.ScaleStep: ("FP32", None),
    c.ClipStep: (None, None),
    c.StandardizeStep: ("FP32", 2),
}
# Every built-in step's outputs are known: the check follows the tensors through all of them.
KNOWN_STEPS = frozenset(
    {
        *_REPLACING,
        *_IN_PLACE,
        c.ResizeStep,
        c.TokenizeStep,
        c.DecodeStep,
        c.ColorStep,
        c.NormalizeTextStep,
    }
)


def check(name: str, spec: Pipeline, steps: list[tuple[c.StepSpec, Step]], root: Path) -> None:
    """Raise ValueError naming the pipeline, step and tensor where the steps do not end with
    exactly what a model version takes."""
    flow = Flow(name)
    flow.make("the client", {t.name: Made(t.datatype, len(t.shape)) for t in spec.inputs})
    for stage, step in steps:
        label = f"preprocess step {stage.label!r}"
        flow.need(label, _reads(stage))
        flow.make(label, *_makes(stage, step, flow))
    flow.need("forward_to_postprocess", spec.forward_to_postprocess)
    for model in spec.first_models():  # a fallback takes what its model takes
        for version in wiring.versions(root, model.name, model.versions_called()):
            wiring.check_model_inputs(flow, version)


def _reads(stage: c.StepSpec) -> list[str]:
    names = [getattr(stage, "input", None), getattr(stage, "pair", None)]
    return [n for n in names if n is not None]


def _makes(stage: c.StepSpec, step: Step, flow: Flow) -> tuple[dict[str, Made] | None, list[str]]:
    """The tensors a step writes (None: it does not say) and those it takes away."""
    source = getattr(stage, "input", "")
    before = flow.tensors[source].made if source in flow.tensors else Made()
    if isinstance(stage, c.TokenizeStep):
        outputs = (stage.input_ids, stage.attention_mask, stage.token_type_ids)
        return {n: Made("INT64", 2) for n in outputs if n}, _reads(stage)
    if isinstance(stage, c.DecodeStep | c.ColorStep):
        return {stage.target: Made("UINT8", 3 if stage.mode == "L" else 4)}, [source]
    if isinstance(stage, c.NormalizeTextStep):
        return {stage.target: before}, []
    kind = type(stage)
    if kind in _REPLACING:
        datatype, rank = _REPLACING[kind]
        datatype = getattr(stage, "datatype", datatype)
        made = Made(datatype or before.datatype, rank or before.rank)
        target: str = getattr(stage, "output", None) or source  # as WritesOutput.target
        return {target: made}, [source]
    if isinstance(stage, c.ResizeStep):  # UINT8 stays UINT8 (steps/image.py)
        kept = before.datatype if before.datatype in ("UINT8", None) else "FP32"
        return {source: Made(kept, before.rank)}, []
    if kind in _IN_PLACE:
        datatype, rank = _IN_PLACE[kind]
        return {source: Made(datatype or before.datatype, rank or before.rank)}, []
    where = f"pipeline {flow.pipeline!r}: preprocess step {stage.label!r}"
    return wiring.declared(step, where), []
