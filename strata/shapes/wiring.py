"""A pipeline's wiring checked against its model's ONNX signature, at start-up.

Preprocess follows the tensors from the pipeline's declared inputs through its steps and
checks that they end as exactly the model's inputs (names, datatypes, ranks); postprocess
follows them from the model's outputs through its rules and checks that each rule finds its
inputs and that the rules make the pipeline's declared outputs. Each service checks the
stages it runs, because only it knows them (a plugin is imported nowhere else), against
every model version a route may call, read from the shared repository.

Where a stage does not say what it makes (a plugin without `outputs`), what follows it is
checked only as far as it can be: the names it may have made are not known to be missing.
A mismatch is a ValueError naming the pipeline, the stage and the tensor; the service stops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from strata.models import onnxsig, repository
from strata.models.onnxsig import TensorInfo
from strata.plugins import Made
from strata.wire.triton_sequences import model_sequence
from strata.wire.v2meta import Tensor as Declared  # a tensor a pipeline declares (its TensorSpec)


@dataclass(frozen=True)
class Known:
    """What is known of one tensor at some point of a pipeline, and which stage made it."""

    made: Made
    stage: str


@dataclass
class Flow:
    """The tensors at one point of a pipeline. `open`: an earlier stage did not say what it
    makes, so tensors not listed here may exist too."""

    pipeline: str
    tensors: dict[str, Known] = field(default_factory=dict)
    open: bool = False

    def make(
        self, stage: str, made: Mapping[str, Made] | None, consumed: Iterable[str] = ()
    ) -> None:
        """After `stage`: `made` (None: unknown) written, `consumed` gone."""
        for name in consumed:
            self.tensors.pop(name, None)
        if made is None:
            self.open = True
            self.tensors = {n: Known(Made(), k.stage) for n, k in self.tensors.items()}
            return
        for name, what in made.items():
            self.tensors[name] = Known(self._over(name, what), stage)

    def _over(self, name: str, made: Made) -> Made:
        """What `made` leaves unsaid (None) about a tensor it writes over stays as it was."""
        before = self.tensors[name].made if name in self.tensors else Made()
        return Made(made.datatype or before.datatype, made.rank or before.rank)

    def need(self, stage: str, names: Iterable[str]) -> None:
        """Raise unless every tensor `stage` reads may be there."""
        for name in names:
            if name not in self.tensors and not self.open:
                raise ValueError(
                    f"pipeline {self.pipeline!r}: {stage} reads tensor {name!r}, which nothing "
                    f"before it makes (there: {sorted(self.tensors)})"
                )


@dataclass(frozen=True)
class Sized:
    """A tensor preprocess ends with, as the pipeline's config says (strata.shapes.sizes): its
    sizes, -1 where not known, and the stage that made it."""

    sizes: tuple[int, ...]
    stage: str


@dataclass(frozen=True)
class Version:
    """One model version a pipeline may call, as its ONNX graph declares it."""

    label: str  # "model 'digits' version 2"
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]


def versions(root: Path, model: str, wanted: Iterable[str]) -> list[Version]:
    """The versions of `model` in the repository that `wanted` may call ("" is whichever the
    inference service serves: every version folder). None when the folder is not there:
    inference refuses such a model itself."""
    available = repository.versions(root / model)
    names = set(wanted)
    numbers = sorted(available) if "" in names else sorted(int(v) for v in names if v.isdigit())
    # A stateful model's control and state inputs are the inference service's to feed, and
    # its state outputs its to keep: the pipeline's stages never see them.
    sequence = model_sequence(root / model)
    fed, kept = (sequence.fed, sequence.kept) if sequence else (set(), set())
    found = []
    for number in numbers:
        if number in available:
            inputs, outputs = onnxsig.read(available[number] / "model.onnx")
            inputs = [t for t in inputs if t.name not in fed]
            outputs = [t for t in outputs if t.name not in kept]
            found.append(Version(f"model {model!r} version {number}", inputs, outputs))
    return found


def check_same(
    pipeline: str,
    wired: Sequence[Version],
    new: Version,
    made: Mapping[str, Sized] | None = None,
) -> None:
    """Raise unless `new` takes and gives what one of `wired` does (the versions a
    pipeline's stages were checked against): the names, datatypes and ranks the wiring
    reads, so that `new` fits the pipeline exactly as that one did; and each size it fixes
    is one preprocess is known to make (`made`, its sizes from the config, or the size the
    version checked at start took), or for an output, the one that version gave."""
    differences = [_difference(version, new, made or {}) for version in wired]
    if wired and all(differences):
        raise ValueError(
            f"pipeline {pipeline!r}: its steps and rules were checked at start against "
            f"{wired[0].label}, and {differences[0]}; a version loaded later must take and "
            "give what they were checked against (restart preprocess and postprocess to "
            "check them against another)"
        )


def _difference(old: Version, new: Version, made: Mapping[str, Sized]) -> str:
    """How `new`'s inputs and outputs differ from `old`'s, as the wiring reads them ("": they
    do not)."""
    for side, before, after in (
        ("input", old.inputs, new.inputs),
        ("output", old.outputs, new.outputs),
    ):
        was = {t.name: t for t in before}
        now = {t.name: t for t in after}
        for name in sorted(was.keys() | now.keys()):
            if name not in now:
                return f"{new.label} has no {side} {name!r} (its {side}s: {sorted(now)})"
            if name not in was:
                return f"{new.label} has {side} {name!r}, which {old.label} has not"
            kind, wired = _kind(now[name]), _kind(was[name])
            if kind != wired:
                return (
                    f"{new.label}'s {side} {name!r} is {kind[0]} of rank {kind[1]}, not "
                    f"{wired[0]} of rank {wired[1]}"
                )
            if side == "input":
                misfit = _misfit(name, was[name].shape, now[name].shape, made.get(name))
            else:
                misfit = _other_sizes(name, was[name].shape, now[name].shape, old.label)
            if misfit:
                return f"{new.label} {misfit}"
    return ""


def _kind(info: TensorInfo) -> tuple[str, int]:
    return info.datatype, len(info.shape)


def _misfit(name: str, wired: Sequence[int], now: Sequence[int], made: Sized | None) -> str:
    """Where input `name` of sizes `now` may not take what preprocess makes: each size is
    known from the config (`made`) or, failing that, is the one the version checked at start
    took (the dry run held preprocess's output against it)."""
    static = made.sizes if made is not None and len(made.sizes) == len(now) else ()
    known = [s if s != -1 else w for s, w in zip(static or wired, wired, strict=True)]
    if all(n in (-1, k) for n, k in zip(now, known, strict=True)):
        return ""
    stage = made.stage if static and made is not None else "preprocess"
    return (
        f"takes input {name!r} as {list(now)}, but {stage} gives it as {known} (-1: a size "
        "not known to be fixed)"
    )


def _other_sizes(name: str, wired: Sequence[int], now: Sequence[int], label: str) -> str:
    """Where output `name` has a fixed size other than the one the rules were checked with."""
    if all(-1 in (w, n) or w == n for w, n in zip(wired, now, strict=True)):
        return ""
    return f"gives output {name!r} as {list(now)}, but {label} gave it as {list(wired)}"


def from_model(pipeline: str, version: Version) -> Flow:
    """The tensors after the model: its outputs."""
    made = {t.name: Made(t.datatype, len(t.shape)) for t in version.outputs}
    flow = Flow(pipeline)
    flow.make(version.label, made)
    return flow


def check_model_inputs(flow: Flow, version: Version) -> None:
    """Raise unless preprocess ends with exactly the model's inputs, of its datatypes and
    ranks (as far as they are known)."""
    where = f"pipeline {flow.pipeline!r}"
    taken = {info.name for info in version.inputs}
    for info in version.inputs:
        known = flow.tensors.get(info.name)
        if known is None:
            if flow.open:
                continue
            raise ValueError(
                f"{where}: {version.label} takes input {info.name!r}, which no preprocess step "
                f"makes (preprocess ends with {sorted(flow.tensors)})" + _instead(flow, taken)
            )
        _fits(where, known, info, version.label)
    for name, known in flow.tensors.items():
        if name not in taken and not flow.open:  # an unknown stage may have dropped it
            raise ValueError(
                f"{where}: {known.stage} gives {name!r}, which {version.label} "
                f"does not take (its inputs: {sorted(taken)})"
            )


def _instead(flow: Flow, taken: set[str]) -> str:
    """What preprocess gives that the model does not take, by the stage that made it."""
    extra = sorted(set(flow.tensors) - taken)
    return "".join(f"; {flow.tensors[name].stage} gives {name!r} instead" for name in extra)


def _fits(where: str, known: Known, info: TensorInfo, model: str) -> None:
    made = known.made
    _same_kind(
        made,
        info,
        f"{where}: {known.stage} gives {info.name!r} as {made.datatype}, "
        f"but {model} takes it as {info.datatype}",
        f"{where}: {known.stage} gives {info.name!r} with {made.rank} "
        f"dimensions, but {model} takes {len(info.shape)} ({list(info.shape)})",
    )


def _same_kind(made: Made, wanted: Declared, other_datatype: str, other_rank: str) -> None:
    """Raise unless a tensor as made is of `wanted`'s datatype and rank, as far as what made
    it says: a ValueError saying `other_datatype` or `other_rank`."""
    if made.datatype is not None and made.datatype != wanted.datatype:
        raise ValueError(other_datatype)
    if made.rank is not None and made.rank != len(wanted.shape):
        raise ValueError(other_rank)


def check_outputs(flow: Flow, declared: Iterable[Declared]) -> None:
    """Raise unless the rules make every output the pipeline declares, of its datatype and
    rank where they are known."""
    where = f"pipeline {flow.pipeline!r}"
    for spec in declared:
        known = flow.tensors.get(spec.name)
        if known is None:
            if flow.open:
                continue
            raise ValueError(
                f"{where}: declares output {spec.name!r}, which neither the model nor any rule "
                f"makes (there: {sorted(flow.tensors)})"
            )
        made = known.made
        _same_kind(
            made,
            spec,
            f"{where}: {known.stage} gives output {spec.name!r} as {made.datatype}, but "
            f"the pipeline declares {spec.datatype}",
            f"{where}: {known.stage} gives output {spec.name!r} with {made.rank} "
            f"dimensions, but the pipeline declares {list(spec.shape)}",
        )


def declared(stage: object, where: str) -> dict[str, Made] | None:
    """The tensors a step or rule says it makes (its `outputs`, strata.plugins.Made), or
    None where it does not say."""
    outputs = getattr(stage, "outputs", None)
    if outputs is None:
        return None
    if not isinstance(outputs, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Made) for k, v in outputs.items()
    ):
        raise ValueError(f"{where}: outputs must map tensor names to strata.plugins.Made")
    return dict(outputs)


class Staged(Protocol):
    """A later model stage as the config declares it (strata.config.pipelines.Stage)."""

    label: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    when: object | None
    fallback: object | None
    parallel: bool


def model_flows(root: Path, pipeline: str, spec: object) -> list[tuple[str, Flow]]:
    """The tensors postprocess receives from a pipeline's models (strata.config Pipeline
    `spec`), for each combination of the model versions its routes call (the first model's
    or its fallback's, then each stage's or its fallback's), with a label
    naming them; the later stages' wiring (docs/pipelines.md) checked on the way: each
    stage's inputs fed by tensors of its model's datatypes and ranks, its outputs known, a
    conditional stage giving only what earlier stages gave, its condition's tensor there."""
    flows = []
    for first in spec.first_models():  # type: ignore[attr-defined]
        for version in versions(root, first.name, first.versions_called()):
            flow = from_model(pipeline, version)
            fed = {
                t.name: Known(Made(t.datatype, len(t.shape)), "preprocess") for t in version.inputs
            }
            flows += _through(root, flow, fed, spec.stages, version.label)  # type: ignore[attr-defined]
    return flows


def _through(
    root: Path,
    given: Flow,
    fed: dict[str, Known],
    stages: Sequence[Any],  # the config's StageSpecs, a floor above
    label: str,
    before: Flow | None = None,
) -> list[tuple[str, Flow]]:
    """`given` (what the models gave so far) after `stages`, each version of the next one's
    model and of its fallback; `before`: what there was before the running group of
    parallel stages (a parallel stage reads from there)."""
    if not stages:
        return [(label, given)]
    stage, later = stages[0], stages[1:]
    base = before if stage.parallel and before is not None else given
    mates = {n for n, k in given.tensors.items() if base.tensors.get(n) is not k}
    found = []
    models = [stage.model, *([stage.fallback.model] if stage.fallback else [])]
    every = [v for m in models for v in versions(root, m.name, m.versions_called())]
    for version in every:
        checked = Flow(base.pipeline, dict(base.tensors), base.open)
        _stage(checked, fed, stage, version)
        made = {n: k for n, k in checked.tensors.items() if base.tensors.get(n) is not k}
        clash = sorted(set(made) & mates)
        if clash:
            raise ValueError(
                f"pipeline {given.pipeline!r}: stage {stage.label!r} runs beside the stage "
                f"before it and both give {clash[0]!r}; rename one in its outputs"
            )
        after = Flow(given.pipeline, {**given.tensors, **made}, given.open)
        found += _through(root, after, fed, later, f"{label}, {version.label}", base)
    return found


def _stage(given: Flow, fed: Mapping[str, Known], stage: Staged, version: Version) -> None:
    """Check one version of a stage's model against what is there, and add what it gives."""
    where = f"pipeline {given.pipeline!r}: stage {stage.label!r} ({version.label})"
    there = {**fed, **given.tensors}
    _check_inputs(where, there, stage, version)
    gives = {info.name: info for info in version.outputs}
    unknown = sorted(set(stage.outputs) - set(gives))
    if unknown:
        raise ValueError(
            f"{where}: outputs renames {unknown[0]!r}, which the model does not "
            f"give (its outputs: {sorted(gives)})"
        )
    if stage.when is not None:
        _check_condition(where, there, stage)
    for name, info in gives.items():
        given_as = stage.outputs.get(name, name)
        if stage.when is not None:
            _keeps(where, given, given_as, info)
        given.tensors[given_as] = Known(Made(info.datatype, len(info.shape)), version.label)


def _check_inputs(where: str, there: Mapping[str, Known], stage: Staged, version: Version) -> None:
    """Raise unless each model input is fed by a tensor that is there, of its kind."""
    takes = {info.name: info for info in version.inputs}
    unknown = sorted(set(stage.inputs) - set(takes))
    if unknown:
        raise ValueError(
            f"{where}: the model takes no input {unknown[0]!r} (its inputs: {sorted(takes)})"
        )
    unfed = sorted(set(takes) - set(stage.inputs))
    if unfed:
        raise ValueError(
            f"{where}: the model's input {unfed[0]!r} is fed by nothing; name its "
            f"tensor in the stage's inputs"
        )
    for model_input, source in stage.inputs.items():
        if source not in there:
            raise ValueError(
                f"{where}: input {model_input!r} is fed by {source!r}, which "
                f"neither preprocess nor an earlier model gives (there: {sorted(there)})"
            )
        _feeds(where, source, there[source].made, takes[model_input])


def _feeds(where: str, source: str, made: Made, info: TensorInfo) -> None:
    _same_kind(
        made,
        info,
        f"{where}: input {info.name!r} is fed by {source!r}, a {made.datatype} tensor, "
        f"but the model takes {info.datatype}",
        f"{where}: input {info.name!r} is fed by {source!r}, of {made.rank} dimensions, "
        f"but the model takes {len(info.shape)} ({list(info.shape)})",
    )


def _check_condition(where: str, there: Mapping[str, Known], stage: Staged) -> None:
    tensor = stage.when.tensor  # type: ignore[attr-defined]
    known = there.get(tensor)
    if known is None:
        raise ValueError(
            f"{where}: its condition reads {tensor!r}, which nothing before it "
            f"gives (there: {sorted(there)})"
        )
    if known.made.datatype in ("BYTES", "BOOL"):
        raise ValueError(
            f"{where}: its condition reads {tensor!r}, a {known.made.datatype} "
            "tensor; a condition measures numbers"
        )


def _keeps(where: str, given: Flow, name: str, info: TensorInfo) -> None:
    """A conditional stage's output must be one an earlier model gave, of its kind: the rows
    the stage passes over keep that one."""
    known = given.tensors.get(name)
    if known is None:
        raise ValueError(
            f"{where}: runs on a condition, so it may only give tensors an "
            f"earlier model gave, for the rows it passes over keep those; it gives "
            f"{name!r} (earlier models give {sorted(given.tensors)})"
        )
    made = known.made
    if (made.datatype, made.rank) != (info.datatype, len(info.shape)):
        raise ValueError(
            f"{where}: gives {name!r} as {info.datatype} of rank {len(info.shape)}, "
            f"but {known.stage} gave it as {made.datatype} of rank {made.rank}; "
            "the rows the stage passes over keep that one"
        )
