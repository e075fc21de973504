"""A model version loaded after start, re-checked against the pipelines that call it.

At start, preprocess and postprocess check each pipeline's steps, rules and model stages
against every model version its routes may call (strata.shapes.wiring), and preprocess runs its
steps once on a synthetic request to hold what they make against each version's sizes; the
steps run only there (a plugin is imported nowhere else). So a version hot-swapped in later
(a load, a poll) fits a pipeline as a version checked at start did when it takes and gives
the names, datatypes and ranks that one does, and each size it fixes is one preprocess is
known to make: from the config of the built-in steps (strata.shapes.sizes: a crop's size, a
layout's order), or the size the version checked at start took. One that does not (images
channels last where CHW was taken, a renamed input) is refused, naming the pipeline, the
stage and the tensor, and the versions serving keep serving; those services check their
steps against it when they restart.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.inference.model import ModelVersion
from strata.config.pipelines import Pipeline
from strata.errors import NotReady
from strata.shapes import sizes, wiring

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Call:
    """A pipeline's call of a model: the versions its routes name ("": any it serves), and
    the sizes of what preprocess makes where the model is the first (None: not known)."""

    pipeline: str
    versions: frozenset[str]
    made: Mapping[str, wiring.Sized] | None = None

    def reaches(self, version: int) -> bool:
        return bool({"", str(version)} & self.versions)

    def wired(self, checked: Mapping[int, wiring.Version], version: int) -> list[wiring.Version]:
        """The versions checked at start that this call of `version` was wired to: any, for
        a call of whichever version serves; else that version as it was."""
        if "" in self.versions:
            return [checked[n] for n in sorted(checked)]
        return [checked[version]] if version in checked else []


class Rewiring:
    """Each model's calls by the config's pipelines, and the versions serving at start."""

    def __init__(self, pipelines: Mapping[str, Pipeline]) -> None:
        self._calls: dict[str, list[Call]] = defaultdict(list)
        for name, spec in pipelines.items():
            made = sizes.made(spec)
            first = {model.name for model in spec.first_models()}
            for model in spec.model_refs():
                fed = made if model.name in first else None
                self._calls[model.name].append(Call(name, frozenset(model.versions_called()), fed))
        self._checked: dict[str, dict[int, wiring.Version]] | None = None

    def started(self, serving: Mapping[str, Iterable[ModelVersion]]) -> None:
        """Start is over: `serving` are the versions the pipelines' stages were checked
        against; every version loaded from now on is checked against them."""
        self._checked = {
            name: {m.version: _as_wired(m) for m in versions} for name, versions in serving.items()
        }

    def check(self, model: ModelVersion) -> None:
        """NotReady naming the pipeline and tensor unless `model` fits every pipeline that
        calls its version as a version checked at start did."""
        if self._checked is None:
            return  # start-up: preprocess and postprocess check these themselves
        calls = [c for c in self._calls.get(model.name, ()) if c.reaches(model.version)]
        checked = self._checked.get(model.name, {})
        if calls and not checked:
            log.warning(
                "model %s version %s: no version of it served at start, so its fit to "
                "pipelines %s is checked when preprocess and postprocess next start",
                model.name,
                model.version,
                sorted({c.pipeline for c in calls}),
            )
        new = _as_wired(model, " (loaded now)")
        for call in calls:
            try:
                wiring.check_same(call.pipeline, call.wired(checked, model.version), new, call.made)
            except ValueError as exc:
                raise NotReady(str(exc)) from None


def _as_wired(model: ModelVersion, now: str = "") -> wiring.Version:
    signature = model.signature
    label = f"model {model.name!r} version {model.version}{now}"
    return wiring.Version(label, signature.inputs, signature.outputs)
