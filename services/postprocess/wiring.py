"""What each postprocess rule reads and makes, followed from the model's outputs to the
pipeline's declared outputs and checked against every model version a route may call
(strata.wiring), when the service starts."""

from __future__ import annotations

from pathlib import Path

from strata import wiring
from strata.config.pipelines import Pipeline
from strata.config.postprocess import PluginRule, RuleSpec
from strata.plugins import Made, Rule
from strata.wiring import Flow, Version

# The keys of a built-in rule that name a tensor it writes; an unset `output` or `values`
# means the rule writes over its input.
_WRITES = ("output", "values", "indices")


def check(name: str, spec: Pipeline, rules: list[tuple[RuleSpec, Rule]], root: Path) -> None:
    """Raise ValueError naming the pipeline, rule and tensor where a rule lacks an input or
    the pipeline's declared outputs are not made, for any model version a route may call."""
    for version in wiring.versions(root, spec.model.name, spec.model.versions_called()):
        _check_version(name, spec, rules, version)


def _check_version(
    name: str, spec: Pipeline, rules: list[tuple[RuleSpec, Rule]], version: Version
) -> None:
    flow = wiring.from_model(name, version)
    forwarded = dict.fromkeys(spec.forward_to_postprocess, Made())
    flow.make("preprocess (forward_to_postprocess)", forwarded)
    for stage, rule in rules:
        label = f"postprocess rule {stage.label!r}"
        flow.need(f"{label} (with {version.label})", rule.inputs)
        flow.make(label, _makes(stage, rule, flow))
    wiring.check_outputs(flow, spec.outputs)


def _makes(stage: RuleSpec, rule: Rule, flow: Flow) -> dict[str, Made] | None:
    """The tensors a rule writes; None where it does not say (a plugin without outputs)."""
    if isinstance(stage, PluginRule):
        where = f"pipeline {flow.pipeline!r}: postprocess rule {stage.label!r}"
        return wiring.declared(rule, where)
    source = getattr(stage, "input", None)
    names = set()
    for key in _WRITES:
        if hasattr(stage, key):
            names.add(getattr(stage, key) or source)
    return dict.fromkeys(names - {None}, Made())
