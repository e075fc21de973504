"""A pipeline's rule chain: its rules in order, when each runs, and one request's pass.

A flight's members share their parameters, so one pass decides for all of them.

Whether a rule runs is decided when its turn comes, in this order:
1. an optional rule (`core: false`) does not run when the request asks for `core_only`;
2. a rule with `when` runs only if its condition holds (a request parameter, or a tensor
   present at that point in the chain);
3. a rule whose inputs are missing because an earlier rule was skipped is skipped too.
Every rule that did not run, for whichever reason (its time limit, 1, 2 or 3), is named in
`skipped_rules`, so the caller knows which outputs the answer lacks and why. A protecting
rule (`protects`, always core) that did not run but for its `when` is `unprotected`: the
engine then refuses the request rather than answer without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.postprocess import wiring
from services.postprocess.rules import Rule, build_rule, is_bounded
from strata.config.pipelines import OutputSpec, Pipeline
from strata.config.postprocess import PostprocessSettings, RuleSpec
from strata.errors import NotReady
from strata.wire.codec import Arrays, datatype_of


@dataclass(frozen=True)
class Condition:
    """A rule's `when`: a request parameter (optionally with a value) or a tensor exists."""

    parameter: str | None = None
    equals: str | None = None
    tensor: str | None = None
    negate: bool = False

    @classmethod
    def from_config(cls, when: Mapping[str, str | bool]) -> Condition:
        """From a rule's `when`, whose keys and types the config has already checked."""
        return cls(
            parameter=_text(when.get("parameter")),
            equals=_text(when.get("equals")),
            tensor=_text(when.get("tensor")),
            negate=bool(when.get("negate", False)),
        )

    def holds(self, tensors: Arrays, parameters: Mapping[str, str]) -> bool:
        if self.tensor is not None:
            found = self.tensor in tensors
        elif self.equals is None:
            found = self.parameter in parameters
        else:
            found = parameters.get(self.parameter or "") == self.equals
        return found != self.negate


def _text(value: str | bool | None) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class ChainRule:
    """A built rule and how the chain treats it."""

    name: str
    rule: Rule
    core: bool
    timeout: float
    condition: Condition | None = None
    protects: bool = False


@dataclass
class RuleChain:
    name: str
    rules: list[ChainRule]
    outputs: list[OutputSpec]

    def __post_init__(self) -> None:
        # Shortest limit from each position on: the soonest any later rule can overrun.
        limits = [rule.timeout for rule in self.rules]
        self.shortest_from = [min(limits[i:]) for i in range(len(limits))]
        self.bounded = all(is_bounded(rule.rule) for rule in self.rules)


def build_chain(
    name: str, spec: Pipeline, repository: Path, settings: PostprocessSettings
) -> RuleChain:
    """Build every rule once (files load here); config mistakes raise ValueError naming them."""
    rules: list[ChainRule] = []
    for stage in spec.postprocess:
        where = f"pipeline {name!r}: postprocess rule {stage.label!r}"
        if any(rule.name == stage.label for rule in rules):
            raise ValueError(f"{where}: the name is taken; give the rule a distinct 'name'")
        try:
            rules.append(_chain_rule(stage, repository, settings))
        except (ValueError, OSError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
    built = [rule.rule for rule in rules]
    wiring.check(name, spec, list(zip(spec.postprocess, built, strict=True)), repository)
    return RuleChain(name=name, rules=rules, outputs=spec.answer_outputs())


def _chain_rule(stage: RuleSpec, repository: Path, settings: PostprocessSettings) -> ChainRule:
    return ChainRule(
        name=stage.label,
        rule=build_rule(stage, repository),
        core=stage.core,
        timeout=stage.timeout_seconds or settings.rule_timeout_seconds,
        condition=Condition.from_config(stage.when) if stage.when else None,
        protects=stage.protects,
    )


class Pass:
    """One request's way through a chain.

    A worker thread runs the rules; the event loop watches their time limits and, when one
    overruns, abandons that worker (bumping `generation`, so anything it finishes later is
    ignored) and carries on from the next rule with the tensors from before the overrun.
    Every field is read and written under `lock`.
    """

    def __init__(
        self,
        chain: RuleChain,
        tensors: Arrays,
        parameters: Mapping[str, str],
        core_only: bool,
    ) -> None:
        self.chain = chain
        self.parameters = parameters
        self.core_only = core_only
        self.lock = threading.Lock()
        self.generation = 0
        self.tensors = tensors
        self.index = 0  # the rule running, or the next to consider
        self.started: float | None = None  # monotonic start of the running rule
        self.overran: list[str] = []  # skipped at their limit
        self.skipped: list[str] = []  # overran, and rules that needed what they would make
        self.passed_over: list[str] = []  # did not run by choice (core_only, when)
        self.timed: list[str] = []  # "rule 0.123 ms" for each rule that ran, for the span

    # The worker thread's side.

    def claim(self, generation: int) -> tuple[int, ChainRule, Arrays, float] | None:
        """The next rule to run, its input and its deadline; None when done or abandoned."""
        rules = self.chain.rules
        with self.lock:
            while self.generation == generation and self.index < len(rules):
                entry = rules[self.index]
                if self._should_run(entry):
                    self.started = time.monotonic()
                    return self.index, entry, self.tensors, self.started + entry.timeout
                self.index += 1
            return None

    def finish(self, generation: int, index: int, result: Arrays | None) -> None:
        """Store a rule's result (None: it stopped at its limit), unless abandoned meanwhile."""
        with self.lock:
            if self.generation != generation:
                return
            if result is None:
                self._skip(self.chain.rules[index].name)
            else:
                self.tensors = result
            self.index, self.started = index + 1, None

    def _should_run(self, entry: ChainRule) -> bool:
        if (self.core_only and not entry.core) or (
            entry.condition is not None and not entry.condition.holds(self.tensors, self.parameters)
        ):
            self.passed_over.append(entry.name)
            self.skipped.append(entry.name)
            return False
        if all(name in self.tensors for name in entry.rule.inputs):
            return True
        if self.skipped:
            self.skipped.append(entry.name)
            return False
        if self.passed_over:
            return False
        missing = sorted(set(entry.rule.inputs) - set(self.tensors))
        raise NotReady(
            f"pipeline {self.chain.name!r}: rule {entry.name!r} needs tensor {missing[0]!r}, "
            f"which neither the model nor an earlier rule made (there: {sorted(self.tensors)})"
        )

    def _skip(self, name: str) -> None:
        self.overran.append(name)
        self.skipped.append(name)

    # The event loop's side.

    def wait_seconds(self) -> float | None:
        """How long the loop may sleep before some rule could overrun; None: none can now."""
        with self.lock:
            if self.index >= len(self.chain.rules):
                return None
            soonest = self.chain.shortest_from[self.index]
            if self.started is None:
                return soonest
            deadline = self.started + self.chain.rules[self.index].timeout
            return max(0.0, min(deadline - time.monotonic(), soonest))

    def abandon_if_overdue(self) -> bool:
        """Skip the running rule if it is past its limit; True if it was abandoned."""
        with self.lock:
            if self.started is None:
                return False
            entry = self.chain.rules[self.index]
            if time.monotonic() < self.started + entry.timeout:
                return False
            self._skip(entry.name)
            self.index, self.started = self.index + 1, None
            self.generation += 1
            return True

    def abandon(self) -> None:
        """Stop the worker at its next rule boundary (the request was cancelled)."""
        with self.lock:
            self.generation += 1

    def timeout_of(self, name: str) -> float:
        return next(rule.timeout for rule in self.chain.rules if rule.name == name)

    # After the pass.

    def outputs(self) -> Arrays:
        """The declared outputs; after a skip, only those that were made. One that should
        have been made, or that is not of its declared datatype and shape, is the server's
        fault (FAILED_PRECONDITION): the pipeline does not make what it declares."""
        made = {}
        for spec in self.chain.outputs:
            array = self.tensors.get(spec.name)
            if array is not None:
                made[spec.name] = conform(self.chain.name, spec, array)
            elif not (self.skipped or self.passed_over):
                raise NotReady(
                    f"pipeline {self.chain.name!r}: output {spec.name!r} was not made (there: "
                    f"{sorted(self.tensors)}); its rules do not make what it declares"
                )
        return made

    def unprotected(self) -> list[str]:
        """The protecting rules that were to run and did not: the answer must not go out."""
        chosen = set(self.passed_over)
        return [
            rule.name
            for rule in self.chain.rules
            if rule.protects and rule.name in self.skipped and rule.name not in chosen
        ]

    def info(self) -> dict[str, str]:
        return {"skipped_rules": ",".join(self.skipped)} if self.skipped else {}


def conform(pipeline: str, spec: OutputSpec, array: np.ndarray) -> np.ndarray:
    """`array` if it has the datatype and shape the pipeline declares for it, else NotReady
    (FAILED_PRECONDITION) naming both: the pipeline does not make what it promises."""
    datatype = datatype_of(array)
    fits = array.ndim == len(spec.shape) and all(
        d in (-1, s) for d, s in zip(spec.shape, array.shape, strict=False)
    )
    if datatype != spec.datatype or not fits:
        raise NotReady(
            f"pipeline {pipeline!r}: output {spec.name!r} is {datatype} {list(array.shape)}, "
            f"but the pipeline declares {spec.datatype} {spec.shape}"
        )
    return array
