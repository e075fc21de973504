"""Text rules alone: keyword and regex filters (with their timeouts) and output formatting."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from services.postprocess.rules import RuleContext, RuleTimeout
from services.postprocess.rules import build_rule_options as build
from services.postprocess.rules.base import Misconfigured
from strata.errors import InvalidArgument

# A pattern that backtracks exponentially on a run of letters with no digit after it.
CATASTROPHIC = r"(\w|\w\w)*\d"


def strings(*items: bytes | str) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = [item.encode() if isinstance(item, str) else item for item in items]
    return out


def apply(kind: str, tensors: dict, base_dir: Path = Path("."), seconds: float = 10, **options):
    rule = build(kind, options, base_dir)
    return rule.apply(tensors, RuleContext(time.monotonic() + seconds))


# keyword_filter


def test_keywords_flag_whole_words_in_any_case() -> None:
    text = strings("Free MONEY now", "moneyball", "learn c++ today", "", "ice cream")
    out = apply(
        "keyword_filter", {"t": text}, input="t", output="bad", keywords=["money", "c++", "cream"]
    )
    assert out["bad"].dtype == np.bool_
    assert out["bad"].tolist() == [True, False, True, False, True]
    assert out["t"] is text  # flagging leaves the text alone


def test_keywords_case_sensitive_substrings_and_files(tmp_path: Path) -> None:
    (tmp_path / "banned.txt").write_text("Money\n")
    text = strings("Free MONEY", "Moneyball")
    out = apply(
        "keyword_filter",
        {"t": text},
        tmp_path,
        input="t",
        output="bad",
        keywords_file="banned.txt",
        case_sensitive=True,
        whole_words=False,
    )
    assert out["bad"].tolist() == [False, True]


def test_keywords_replace_and_redact() -> None:
    text = strings("buy cheap pills", "hello").reshape(2, 1)
    replaced = apply(
        "keyword_filter",
        {"t": text},
        input="t",
        keywords=["pills"],
        action="replace",
        replacement="[removed]",
    )
    assert replaced["t"].tolist() == [[b"[removed]"], [b"hello"]]
    redacted = apply(
        "keyword_filter",
        {"t": text},
        input="t",
        output="r",
        keywords=["cheap", "pills"],
        action="redact",
    )
    assert redacted["r"].tolist() == [[b"buy *** ***"], [b"hello"]]


# regex_filter


def test_regex_patterns_flag_and_redact() -> None:
    text = strings("call 555-1234", "mail a@b.org", "nothing", "")
    patterns = [r"\d{3}-\d{4}", r"\S+@\S+"]
    flagged = apply("regex_filter", {"t": text}, input="t", output="pii", patterns=patterns)
    assert flagged["pii"].tolist() == [True, True, False, False]
    redacted = apply(
        "regex_filter",
        {"t": text},
        input="t",
        patterns=patterns,
        action="redact",
        replacement="<x>",
    )
    assert redacted["t"].tolist() == [b"call <x>", b"mail <x>", b"nothing", b""]
    upper = apply(
        "regex_filter",
        {"t": strings("ABC")},
        input="t",
        output="f",
        pattern="abc",
        ignore_case=True,
    )
    assert upper["f"].tolist() == [True]


def test_filters_handle_empty_batches_and_refuse_non_utf8() -> None:
    empty = apply("regex_filter", {"t": strings()}, input="t", output="f", pattern="a")
    assert empty["f"].shape == (0,)
    with pytest.raises(InvalidArgument, match="tensor 't': element 1 is not valid UTF-8"):
        apply("regex_filter", {"t": strings(b"a", b"\xfe")}, input="t", output="f", pattern="a")
    with pytest.raises(InvalidArgument, match="must be BYTES"):
        apply("regex_filter", {"t": np.zeros(2)}, input="t", output="f", pattern="a")


@pytest.mark.timing
def test_a_catastrophic_regex_stops_at_the_rule_limit_without_holding_the_gil() -> None:
    text = strings("a" * 5000)
    ticks = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            apply(
                "regex_filter",
                {"t": text},
                seconds=0.2,
                input="t",
                output="f",
                pattern=CATASTROPHIC,
            )
    finally:
        stop.set()
        ticker.join()
    elapsed = time.monotonic() - started
    assert 0.15 < elapsed < 1.0  # stopped, long before the pattern itself would finish
    # Another thread kept running: no gap near the 200 ms a GIL-holding match would cause.
    assert max(np.diff(ticks)) < 0.15


def test_an_expired_limit_stops_the_rule_before_it_starts() -> None:
    rule = build("regex_filter", {"input": "t", "output": "f", "pattern": "a"}, Path("."))
    with pytest.raises(RuleTimeout):
        rule.apply({"t": strings("a")}, RuleContext(time.monotonic() - 1))


@pytest.mark.parametrize(
    ("kind", "options", "words"),
    [
        ("regex_filter", {"pattern": "(unclosed"}, "does not compile"),
        (
            "regex_filter",
            {"pattern": "a", "action": "drop"},
            "action\n  Input should be 'flag', 'replace'",
        ),
        ("regex_filter", {"pattern": "a", "output": None}, "needs 'output'"),
        ("keyword_filter", {"keywords": []}, "keywords\n  List should have at least 1 item"),
        ("keyword_filter", {"keywords": ["ok", ""]}, "keywords.1\n  String should have at"),
        ("keyword_filter", {}, "give either 'keywords'"),
        ("regex_filter", {"pattern": "a", "patterns": ["b"]}, "either 'pattern' or 'patterns'"),
    ],
)
def test_filter_config_mistakes(kind: str, options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build(kind, {"input": "t", "output": "f", **options}, Path("."))


# format


def test_json_rows_from_scalars_lists_and_strings() -> None:
    tensors = {
        "label": strings("benign", "malin\u00e9").reshape(2, 1),
        "score": np.array([[0.25], [np.nan]], np.float32),
        "top": np.array([[3, 1], [0, 2]], np.int64),
        "bad": np.array([False, True]),
    }
    fields = {"label": "label", "score": "score", "classes": "top", "flagged": "bad"}
    out = apply("format", tensors, output="answer", fields=fields)["answer"]
    assert out.shape == (2,) and out.dtype == object
    assert json.loads(out[0]) == {
        "label": "benign",
        "score": 0.25,
        "classes": [3, 1],
        "flagged": False,
    }
    assert json.loads(out[1]) == {
        "label": "malin\u00e9",
        "score": None,
        "classes": [0, 2],
        "flagged": True,
    }
    assert "\u00e9".encode() in out[1]  # UTF-8, not \u escapes


def test_template_rows_and_undecodable_bytes() -> None:
    tensors = {"l": strings(b"cat", b"d\xffg"), "s": np.array([0.91234, 0.5], np.float32)}
    out = apply(
        "format",
        tensors,
        output="o",
        style="template",
        template="{label} ({score:.2f})",
        fields={"label": "l", "score": "s"},
    )
    assert out["o"].tolist() == [b"cat (0.91)", "d\ufffdg (0.50)".encode()]


def test_format_empty_batch_and_batch_mismatch() -> None:
    empty = apply("format", {"a": np.zeros((0, 2))}, output="o", fields={"a": "a"})
    assert empty["o"].shape == (0,)
    with pytest.raises(InvalidArgument, match="disagree on the batch size"):
        apply(
            "format", {"a": np.zeros(2), "b": np.zeros(3)}, output="o", fields={"a": "a", "b": "b"}
        )


def test_template_type_mismatch_is_a_configuration_error() -> None:
    with pytest.raises(Misconfigured, match=re.escape("template '{x:.2f}' failed")):
        apply(
            "format",
            {"x": strings("a")},
            output="o",
            style="template",
            template="{x:.2f}",
            fields={"x": "x"},
        )


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"fields": {}}, "format.fields\n  Dictionary should have at least 1 item"),
        ({"fields": {"a": "a"}, "style": "xml"}, "format.style\n  Input should be 'json' or"),
        ({"fields": {"a": "a"}, "style": "template"}, "needs a 'template'"),
        ({"fields": {"a": "a"}, "style": "template", "template": "{b}"}, "uses 'b'"),
        ({"fields": {"a": "a"}, "style": "template", "template": "{a.__class__}"}, "plain name"),
        ({"fields": {"a": "a"}, "style": "template", "template": "{0}"}, "plain name"),
        ({"fields": {"a": "a"}, "style": "template", "template": "{a"}, "'}'"),
    ],
)
def test_format_config_mistakes(options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build("format", {"output": "o", **options}, Path("."))
