"""What each postprocess rule reads and makes, followed from the model's outputs to the
pipeline's declared outputs and checked against every model version a route may call
(strata.shapes.wiring), when the service starts."""

from __future__ import annotations

from pathlib import Path

from strata.config.pipelines import Pipeline
from strata.config.postprocess import PluginRule, RuleSpec
from strata.plugins import Made, Rule
from strata.shapes import wiring
from strata.shapes.wiring import Flow

# The keys of a built-in rule that name a tensor it writes; an unset `output` or `values`
# means the rule writes over its input.
_WRITES = ("output", "values", "indices")


def check(name: str, spec: Pipeline, rules: list[tuple[RuleSpec, Rule]], root: Path) -> None:
    """Raise ValueError naming the pipeline, rule and tensor where a rule lacks an input or
    the pipeline's declared outputs are not made, for any model version a route may call."""
    for models, flow in wiring.model_flows(root, name, spec):
        _check_models(spec, rules, models, flow)


def _check_models(
    spec: Pipeline, rules: list[tuple[RuleSpec, Rule]], models: str, flow: Flow
) -> None:
    forwarded = dict.fromkeys(spec.forward_to_postprocess, Made())
    flow.make("preprocess (forward_to_postprocess)", forwarded)
    for stage, rule in rules:
        label = f"postprocess rule {stage.label!r}"
        flow.need(f"{label} (with {models})", rule.inputs)
        flow.make(label, *_makes(stage, rule, flow))
    wiring.check_outputs(flow, spec.answer_outputs())


def _makes(stage: RuleSpec, rule: Rule, flow: Flow) -> tuple[dict[str, Made] | None, list[str]]:
    """The tensors a rule writes (None: a plugin that does not say) and those whose earlier
    kind it does not keep: a built-in's outputs are new tensors whatever was known of their
    names (mean_pool in place changes its input's rank); a plugin's keep what it leaves
    unsaid."""
    if isinstance(stage, PluginRule):
        where = f"pipeline {flow.pipeline!r}: postprocess rule {stage.label!r}"
        return wiring.declared(rule, where), []
    source: str | None = getattr(stage, "input", None)
    written: list[str | None] = [
        getattr(stage, key) or source for key in _WRITES if hasattr(stage, key)
    ]
    names = {name for name in written if name is not None}
    return dict.fromkeys(names, Made()), sorted(names)
