"""Business filters: keyword lists and regular expressions over BYTES tensors.

Each filter either flags matching elements (a BOOL tensor), replaces them whole, or redacts
the matching text inside them. Patterns run in the `regex` module with the rule's remaining
time as their timeout and without holding the GIL, so a catastrophic pattern on a long input
stops at the rule's limit and never stalls other requests.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from services.postprocess.rules.base import RULES, OneInput, load_list
from strata.config.postprocess import FilterSpec, KeywordFilterRule, RegexFilterRule
from strata.plugins import RuleContext, take, texts
from strata.wire.codec import Arrays

if TYPE_CHECKING:  # imported where a filter is built: a config without one never loads it
    import regex


class TextFilter(OneInput):
    """What both filters do: apply `action` to the elements of `input` that their pattern
    (compiled when the filter is built) matches."""

    options: FilterSpec
    _pattern: regex.Pattern[str]

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        options = self.options
        values = take(tensors, options.input, options.kind)
        items = texts(values, options.input)
        if options.action == "flag":
            hits = [self._search(text, context) for text in items]
            result = np.array(hits, dtype=bool).reshape(values.shape)
        else:
            new = options.replacement_text
            if options.action == "replace":
                changed = [new if self._search(t, context) else t for t in items]
            else:
                changed = [self._redact(t, new, context) for t in items]
            result = _bytes_array(changed, values.shape)
        return {**tensors, options.target: result}

    def _search(self, text: str, context: RuleContext) -> bool:
        found = self._pattern.search(text, timeout=context.remaining(), concurrent=True)
        return found is not None

    def _redact(self, text: str, new: str, context: RuleContext) -> str:
        return self._pattern.sub(new, text, timeout=context.remaining(), concurrent=True)


def _compile(source: str, ignore_case: bool) -> regex.Pattern[str]:
    import regex

    flags = regex.IGNORECASE if ignore_case else 0
    try:
        return regex.compile(source, flags)
    except regex.error as exc:
        raise ValueError(f"pattern {source!r} does not compile: {exc}") from None


def _bytes_array(items: list[str], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = [item.encode("utf-8") for item in items]
    return out.reshape(shape)


@RULES.register("regex_filter")
@dataclass
class RegexFilter(TextFilter):
    """One `pattern`, or a list of `patterns` (any of them matches)."""

    options: RegexFilterRule

    def __post_init__(self) -> None:
        options = self.options  # holds one of pattern and patterns, never both
        patterns = [options.pattern] if options.pattern is not None else options.patterns or []
        source = "|".join(f"(?:{p})" for p in patterns)
        self._pattern = _compile(source, self.options.ignore_case)


@RULES.register("keyword_filter", repository=True)
@dataclass
class KeywordFilter(TextFilter):
    """`keywords` inline or a `keywords_file`; whole words and any case unless told otherwise."""

    options: KeywordFilterRule
    repository: InitVar[Path]

    def __post_init__(self, repository: Path) -> None:
        import regex

        options = self.options
        if options.keywords_file is not None:
            keywords = load_list(repository / options.keywords_file, "keywords")
        else:
            keywords = options.keywords or []
        # Longest first, so "ice cream" wins over "ice" when both are listed.
        escaped = "|".join(regex.escape(k) for k in sorted(keywords, key=len, reverse=True))
        # Lookarounds rather than \b, so keywords that end in punctuation ("c++") still match.
        source = rf"(?<!\w)(?:{escaped})(?!\w)" if options.whole_words else escaped
        self._pattern = _compile(source, not options.case_sensitive)
