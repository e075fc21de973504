"""The postprocess rule engine, and the options of every postprocess rule.

Each rule kind has a model here, picked by its `kind`: the shared keys (name, core, when,
timeout_seconds) and the rule's own options, checked when the config loads. The rule's class
in services/postprocess/rules takes the model, validated, as its options (strata.registry);
what needs a file (a labels or keywords file) or a library (a regex that must compile) is
checked there, when the class is built.
"""

from __future__ import annotations

import math
import string
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from strata.config.base import (
    OUTPUT,
    Count,
    Number,
    PluginStage,
    Strict,
    WritesOutput,
    kinds,
    stage_union,
)
from strata.registry import Family

Text = Annotated[str, Field(min_length=1)]

KIND = "Which rule this is; picks the keys it takes."


class PostprocessSettings(Strict):
    """The rule engine: time limits and the threads rule chains run on."""

    rule_timeout_seconds: float = Field(
        default=0.5, gt=0, description="Time limit of a rule that sets no timeout_seconds."
    )
    workers: int = Field(default=4, gt=0, description="Rule chains running at once (threads).")
    spare_threads: int = Field(
        default=4,
        ge=0,
        description="Extra threads that abandoned (overrunning) rules may hold until they end.",
    )
    inline_max_bytes: int = Field(
        default=16384,
        ge=0,
        description="A chain of bounded rules (built-in numeric ones; never a filter or a "
        "plugin) over at most this many bytes of tensors runs on the event loop: the hand-off "
        "to a thread would cost more than the rules. 0: always on a thread.",
    )


class RuleSpec(Strict):
    """What every postprocess rule takes beside its own options."""

    kind: str = Field(description=KIND)
    name: str | None = Field(
        default=None,
        min_length=1,
        description="Name in timings, logs and skipped_rules; defaults to kind; unique per list.",
    )
    core: bool = Field(
        default=True, description="A core rule still runs when a request asks for core_only."
    )
    when: dict[str, str | bool] | None = Field(
        default=None,
        description="Run only if {parameter: P} is sent (equals: V, that value) "
        "or {tensor: T} exists at that point; negate: true inverts it.",
    )
    timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="This rule's limit; postprocess.rule_timeout_seconds when unset.",
    )
    protects: bool = Field(
        default=False,
        description="The rule protects data (e.g. redaction), so it fails closed: if it "
        "cannot finish (its time limit, or an earlier rule skipped) the request is refused "
        "UNAVAILABLE, never answered without it. A protecting rule must be core.",
    )

    @model_validator(mode="after")
    def _protecting_rules_are_core(self) -> RuleSpec:
        if self.protects and not self.core:
            raise ValueError(
                "a protecting rule (protects: true; the default for replace and redact) must "
                "be core: core_only and level 1 would skip it; set core: true, or protects: "
                "false if its output may be left out"
            )
        return self

    @field_validator("when")
    @classmethod
    def _condition(cls, when: dict[str, str | bool] | None) -> dict[str, str | bool] | None:
        if when is None:
            return None
        unknown = sorted(set(when) - {"parameter", "equals", "tensor", "negate"})
        if unknown:
            raise ValueError(
                f"when: unknown key {unknown[0]!r} (parameter, equals, tensor, negate)"
            )
        if ("parameter" in when) == ("tensor" in when):
            raise ValueError("when: give exactly one of 'parameter' or 'tensor'")
        if "equals" in when and "parameter" not in when:
            raise ValueError("when: 'equals' goes with 'parameter'")
        for key in ("parameter", "tensor", "equals"):
            if key in when and not isinstance(when[key], str):
                raise ValueError(f"when: {key!r} must be a string")
        if not isinstance(when.get("negate", False), bool):
            raise ValueError("when: 'negate' must be true or false")
        return when

    @property
    def label(self) -> str:
        """The rule's name in timings, logs and responses."""
        return self.name or self.kind


class SoftmaxRule(RuleSpec, WritesOutput):
    """FP32 probabilities along the last axis, stable for large logits."""

    kind: Literal["softmax"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor of logits.")
    output: str | None = Field(default=None, description=OUTPUT)


class SigmoidRule(RuleSpec, WritesOutput):
    """FP32 1 / (1 + e^-x) per element, without overflow for large |x|."""

    kind: Literal["sigmoid"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor.")
    output: str | None = Field(default=None, description=OUTPUT)


class ThresholdRule(RuleSpec):
    """BOOL score >= threshold; NaN is false."""

    kind: Literal["threshold"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor of scores.")
    output: str = Field(description="The BOOL tensor written.")
    threshold: Number | Annotated[list[Number], Field(min_length=1)] = Field(
        default=0.5,
        description="One threshold for all, or a list with one value per class on the last axis.",
    )


class SortRule(RuleSpec):
    """Scores ordered along the last axis (stable for ties; NaN last), with their INT64
    class indices."""

    kind: Literal["sort"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor of scores.")
    values: str | None = Field(
        default=None, description="Where the ordered scores go; defaults to input."
    )
    indices: str = Field(description="Where the class indices (INT64) go.")
    descending: bool = Field(default=True, description="Best first.")


class TopkRule(RuleSpec):
    """The k best scores, best first, with their INT64 class indices."""

    kind: Literal["topk"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor of scores.")
    k: Count = Field(description="How many; above the number of classes, all of them.")
    values: str = Field(description="Where the scores go.")
    indices: str = Field(description="Where the class indices (INT64) go.")


class LabelsRule(RuleSpec):
    """Class indices to label names (BYTES, same shape), inline or from a file."""

    kind: Literal["labels"] = Field(description=KIND)
    input: str = Field(description="Integer tensor of class indices.")
    output: str = Field(description="Where the label names go.")
    labels: Annotated[list[Text], Field(min_length=1)] | None = Field(
        default=None, description="The labels inline, in class order; or give file."
    )
    file: str | None = Field(
        default=None,
        description="A labels file beside the model: .txt (one a line), .json (a list) or "
        ".yaml (a list, or a mapping with a labels key, so a model.yaml works).",
    )
    classes: int | None = Field(
        default=None,
        strict=True,
        gt=0,
        description="The model's number of classes: fewer labels are refused at start-up.",
    )
    classes_of: str | None = Field(
        default=None,
        description="A tensor with one entry per class on its last axis (e.g. logits): a "
        "request where it has another number of entries than there are labels fails with "
        "FAILED_PRECONDITION.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> LabelsRule:
        if (self.labels is None) == (self.file is None):
            raise ValueError("labels: give either 'labels' (a list) or 'file', not both or neither")
        return self


class MeanPoolRule(RuleSpec, WritesOutput):
    """Token embeddings [batch, tokens, dim] to [batch, dim], averaging unmasked tokens."""

    kind: Literal["mean_pool"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor of token embeddings.")
    output: str | None = Field(default=None, description=OUTPUT)
    mask: str | None = Field(
        default=None,
        description="[batch, tokens] mask (e.g. attention_mask) of the tokens that count; "
        "without it, every token does.",
    )
    normalize: bool = Field(default=False, description="Make the result unit length.")


class L2NormalizeRule(RuleSpec, WritesOutput):
    """Vectors to unit length along the last axis; a zero vector stays zero."""

    kind: Literal["l2_normalize"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor of vectors.")
    output: str | None = Field(default=None, description=OUTPUT)


class MeanRule(RuleSpec):
    """The element-wise mean of tensors of one shape, weighted or not: how the outputs of
    models that ran side by side (a fan-out, docs/pipelines.md) merge into one answer."""

    kind: Literal["mean"] = Field(description=KIND)
    inputs: list[str] = Field(min_length=2, description="Numeric tensors of one shape.")
    weights: list[float] | None = Field(
        default=None, description="One per input, relative; none: every input counts alike."
    )
    output: str = Field(description="The tensor it writes.")

    @model_validator(mode="after")
    def _weights_fit(self) -> MeanRule:
        weights = self.weights
        if weights is None:
            return self
        if len(weights) != len(self.inputs):
            raise ValueError(f"mean: {len(weights)} weights for {len(self.inputs)} inputs")
        if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"mean: weights {weights} must be finite, at least 0, not all 0")
        return self


class FilterSpec(RuleSpec, WritesOutput):
    """What the keyword and regex filters share: what they read and what they do."""

    input: str = Field(description="BYTES tensor (any shape) of UTF-8 text.")
    output: str | None = Field(
        default=None,
        description="The BOOL tensor flag writes (required then); for replace and redact, "
        "where the text goes, defaulting to input.",
    )
    action: Literal["flag", "replace", "redact"] = Field(
        default="flag",
        description="flag: true where an element matches; replace: matching elements "
        "become replacement; redact: the matching text inside each element does.",
    )
    replacement: str | None = Field(
        default=None, description="What replace and redact put in; empty and *** when unset."
    )
    protects: bool = Field(
        default=False,
        description="Fail closed (see the shared keys); unset, true for replace and redact "
        "and false for flag.",
    )

    @model_validator(mode="before")
    @classmethod
    def _text_changes_protect(cls, data: object) -> object:
        """A filter that changes the text (replace, redact) protects it unless told not to."""
        if isinstance(data, dict) and "protects" not in data:
            return {**data, "protects": data.get("action", "flag") != "flag"}
        return data

    @model_validator(mode="after")
    def _flag_needs_output(self) -> FilterSpec:
        if self.action == "flag" and self.output is None:
            raise ValueError("action 'flag' needs 'output', the BOOL tensor it writes")
        return self

    @property
    def replacement_text(self) -> str:
        """What replace and redact put in: `replacement`, or its default for the action."""
        if self.replacement is not None:
            return self.replacement
        return "***" if self.action == "redact" else ""


class KeywordFilterRule(FilterSpec):
    """Keyword lists over a BYTES tensor: whole words and any case unless told otherwise."""

    kind: Literal["keyword_filter"] = Field(description=KIND)
    keywords: Annotated[list[Text], Field(min_length=1)] | None = Field(
        default=None, description="The keywords inline; or give keywords_file."
    )
    keywords_file: str | None = Field(
        default=None, description="A .txt, .json or .yaml list of keywords beside the model."
    )
    whole_words: bool = Field(
        default=True, description="A keyword must not touch letters or digits on either side."
    )
    case_sensitive: bool = Field(default=False, description="Match the case too.")

    @model_validator(mode="after")
    def _one_source(self) -> KeywordFilterRule:
        if (self.keywords is None) == (self.keywords_file is None):
            raise ValueError(
                "give either 'keywords' (a list) or 'keywords_file', not both or neither"
            )
        return self


class RegexFilterRule(FilterSpec):
    """Regular expressions over a BYTES tensor, run with the rule's remaining time as their
    timeout."""

    kind: Literal["regex_filter"] = Field(description=KIND)
    pattern: Text | None = Field(default=None, description="One pattern; or give patterns.")
    patterns: Annotated[list[Text], Field(min_length=1)] | None = Field(
        default=None, description="Patterns of which any matches."
    )
    ignore_case: bool = Field(default=False, description="Match in any case.")

    @model_validator(mode="after")
    def _one_source(self) -> RegexFilterRule:
        if (self.pattern is None) == (self.patterns is None):
            raise ValueError("give either 'pattern' or 'patterns' (a list), not both or neither")
        return self


class FormatRule(RuleSpec):
    """One string per row (BYTES [batch]): a compact JSON object, or a filled template."""

    kind: Literal["format"] = Field(description=KIND)
    output: str = Field(description="Where the strings go.")
    fields: dict[str, str] = Field(
        min_length=1,
        description="Name in the output -> tensor; each row's value is that tensor's row, "
        "a scalar when the row holds one element, else a list.",
    )
    style: Literal["json", "template"] = Field(
        default="json", description="json (NaN and infinities become null), or template."
    )
    template: str = Field(
        default="",
        description="For style template: a Python format string using only the names in "
        'fields, e.g. "{label} ({score:.2f})".',
    )

    @model_validator(mode="after")
    def _template_fits(self) -> FormatRule:
        if self.style != "template":
            return self
        if not self.template:
            raise ValueError("format: style 'template' needs a 'template' string")
        unknown = sorted(_template_fields(self.template) - set(self.fields))
        if unknown:
            raise ValueError(f"format: template uses {unknown[0]!r}, which 'fields' lacks")
        return self


def _template_fields(template: str) -> set[str]:
    """The names a template uses; positional, attribute and index access are refused."""
    names = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(f"template field {{{field}}} must be a plain name from 'fields'")
        names.add(field)
    return names


BUILTIN_RULES = (
    SoftmaxRule,
    SigmoidRule,
    ThresholdRule,
    SortRule,
    TopkRule,
    LabelsRule,
    MeanPoolRule,
    L2NormalizeRule,
    MeanRule,
    KeywordFilterRule,
    RegexFilterRule,
    FormatRule,
)


class PluginRule(PluginStage, RuleSpec):
    """A rule of your own code (docs/plugins.md): `kind` is an import path
    (package.module:Name) or an entry point's name in group strata.rules; the keys every rule
    has (name, core, when, timeout_seconds, protects) are the engine's, the others the
    rule's options, validated by its Options where postprocess runs it."""

    model_config = ConfigDict(extra="allow")
    family: ClassVar[Family] = Family(
        "postprocess rule", "strata.rules", "apply", kinds(BUILTIN_RULES)
    )


Rule = stage_union(BUILTIN_RULES, PluginRule)
