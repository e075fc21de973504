"""Business filters: keyword lists and regular expressions over BYTES tensors.

Each filter either flags matching elements (a BOOL tensor), replaces them whole, or redacts
the matching text inside them. Patterns run in the `regex` module with the rule's remaining
time as their timeout and without holding the GIL, so a catastrophic pattern on a long input
stops at the rule's limit and never stalls other requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import regex

from services.postprocess.rules.base import RULES, RuleContext, load_list, take, texts
from strata.codec import Arrays

ACTIONS = ("flag", "replace", "redact")


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


def _common(options: Mapping[str, Any]) -> dict[str, Any]:
    action = options.get("action", "flag")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {list(ACTIONS)}, got {action!r}")
    output = options.get("output", None if action == "flag" else options["input"])
    if output is None:
        raise ValueError("action 'flag' needs 'output', the BOOL tensor it writes")
    default = "***" if action == "redact" else ""
    return {
        "input": options["input"],
        "output": output,
        "action": action,
        "replacement": str(options.get("replacement", default)),
    }


def _compile(source: str, ignore_case: bool) -> regex.Pattern:
    flags = regex.IGNORECASE if ignore_case else 0
    try:
        return regex.compile(source, flags)
    except regex.error as exc:
        raise ValueError(f"pattern {source!r} does not compile: {exc}") from None


@RULES.register("regex_filter")
def _build_regex_filter(options: Mapping[str, Any], base_dir: Path) -> TextFilter:
    """One `pattern`, or a list of `patterns` (any of them matches)."""
    patterns = options.get("patterns") or [options["pattern"]]
    if not all(isinstance(p, str) and p for p in patterns):
        raise ValueError("patterns must be non-empty strings")
    source = "|".join(f"(?:{p})" for p in patterns)
    pattern = _compile(source, bool(options.get("ignore_case", False)))
    return TextFilter(pattern=pattern, name="regex_filter", **_common(options))


@RULES.register("keyword_filter")
def _build_keyword_filter(options: Mapping[str, Any], base_dir: Path) -> TextFilter:
    """`keywords` inline or a `keywords_file`; whole words and any case unless told otherwise."""
    if "keywords_file" in options:
        keywords = load_list(base_dir / options["keywords_file"], "keywords")
    else:
        keywords = options["keywords"]
    if not isinstance(keywords, list) or not keywords:
        raise ValueError("keywords must be a non-empty list of strings")
    if not all(isinstance(k, str) and k for k in keywords):
        raise ValueError("keywords must be non-empty strings")
    # Longest first, so "ice cream" wins over "ice" when both are listed.
    escaped = "|".join(regex.escape(k) for k in sorted(keywords, key=len, reverse=True))
    whole = bool(options.get("whole_words", True))
    # Lookarounds rather than \b, so keywords that end in punctuation ("c++") still match.
    source = rf"(?<!\w)(?:{escaped})(?!\w)" if whole else escaped
    pattern = _compile(source, not bool(options.get("case_sensitive", False)))
    return TextFilter(pattern=pattern, name="keyword_filter", **_common(options))
