"""Business filters: keyword lists and regular expressions over BYTES tensors.

Each filter either flags matching elements (a BOOL tensor), replaces them whole, or redacts
the matching text inside them. Patterns run in the `regex` module with the rule's remaining
time as their timeout and without holding the GIL, so a catastrophic pattern on a long input
stops at the rule's limit and never stalls other requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import regex

from services.postprocess.rules.base import RULES, load_list
from strata.codec import Arrays
from strata.config.postprocess import FilterSpec, KeywordFilterRule, RegexFilterRule
from strata.plugins import RuleContext, take, texts


@dataclass
class TextFilter:
    """Apply `action` to the elements of `input` that `pattern` matches."""

    input: str
    output: str
    pattern: regex.Pattern
    action: str
    replacement: str = ""
    name: str = "regex_filter"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        values = take(tensors, self.input, self.name)
        items = texts(values, self.input)
        if self.action == "flag":
            hits = [self._search(text, context) for text in items]
            result = np.array(hits, dtype=bool).reshape(values.shape)
        elif self.action == "replace":
            kept = [self.replacement if self._search(t, context) else t for t in items]
            result = _bytes_array(kept, values.shape)
        else:
            result = _bytes_array([self._redact(text, context) for text in items], values.shape)
        return {**tensors, self.output: result}

    def _search(self, text: str, context: RuleContext) -> bool:
        found = self.pattern.search(text, timeout=context.remaining(), concurrent=True)
        return found is not None

    def _redact(self, text: str, context: RuleContext) -> str:
        return self.pattern.sub(
            self.replacement, text, timeout=context.remaining(), concurrent=True
        )


def _bytes_array(items: list[str], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = [item.encode("utf-8") for item in items]
    return out.reshape(shape)


def _common(spec: FilterSpec) -> dict[str, Any]:
    default = "***" if spec.action == "redact" else ""
    return {
        "input": spec.input,
        "output": spec.output or spec.input,
        "action": spec.action,
        "replacement": default if spec.replacement is None else spec.replacement,
    }


def _compile(source: str, ignore_case: bool) -> regex.Pattern:
    flags = regex.IGNORECASE if ignore_case else 0
    try:
        return regex.compile(source, flags)
    except regex.error as exc:
        raise ValueError(f"pattern {source!r} does not compile: {exc}") from None


@RULES.register("regex_filter")
def _build_regex_filter(spec: RegexFilterRule, base_dir: Path) -> TextFilter:
    """One `pattern`, or a list of `patterns` (any of them matches)."""
    patterns = spec.patterns or [spec.pattern]
    source = "|".join(f"(?:{p})" for p in patterns)
    pattern = _compile(source, spec.ignore_case)
    return TextFilter(pattern=pattern, name="regex_filter", **_common(spec))


@RULES.register("keyword_filter")
def _build_keyword_filter(spec: KeywordFilterRule, base_dir: Path) -> TextFilter:
    """`keywords` inline or a `keywords_file`; whole words and any case unless told otherwise."""
    if spec.keywords_file is not None:
        keywords = load_list(base_dir / spec.keywords_file, "keywords")
    else:
        keywords = spec.keywords or []
    # Longest first, so "ice cream" wins over "ice" when both are listed.
    escaped = "|".join(regex.escape(k) for k in sorted(keywords, key=len, reverse=True))
    # Lookarounds rather than \b, so keywords that end in punctuation ("c++") still match.
    source = rf"(?<!\w)(?:{escaped})(?!\w)" if spec.whole_words else escaped
    pattern = _compile(source, not spec.case_sensitive)
    return TextFilter(pattern=pattern, name="keyword_filter", **_common(spec))
