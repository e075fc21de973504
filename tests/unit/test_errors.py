"""A client's strings in messages: cut to a bound with their length stated, whatever was sent."""

import logging

import grpc
import pytest

from strata.errors import (
    MAX_LISTED,
    MAX_MESSAGE_BYTES,
    SHOWN_CHARACTERS,
    InvalidArgument,
    PermissionDenied,
    bounded,
    cut,
    from_code,
    listed,
    shown,
    status_of,
)
from strata.telemetry.tracing import JsonFormatter

MIB = 1 << 20


def test_a_short_string_is_shown_whole() -> None:
    assert shown("digits") == "'digits'"
    assert cut("digits") == "digits"


def test_a_long_string_is_cut_with_its_length_stated() -> None:
    assert shown("a" * MIB) == f"'{'a' * SHOWN_CHARACTERS}…' (1048576 characters)"
    assert shown("abcdef", 3) == "'abc…' (6 characters)"
    assert cut("a" * MIB) == "a" * SHOWN_CHARACTERS + "…"


def test_what_exists_is_listed_sorted_and_bounded() -> None:
    assert listed(["tabular", "digits"]) == "'digits', 'tabular'"
    assert listed([]) == "none"
    many = listed(f"p{i:02}" for i in range(MAX_LISTED + 5))
    assert many.startswith("'p00', 'p01'") and many.endswith("'p19' and 5 more")
    assert listed(["x" * MIB]) == repr("x" * SHOWN_CHARACTERS + "…")


def test_a_message_is_bounded_in_utf8_bytes_at_a_whole_character() -> None:
    message = "é" * MIB
    out = bounded(message)
    assert len(out.encode()) <= MAX_MESSAGE_BYTES
    assert out.startswith("éé") and out.endswith(f"… ({MIB} characters)")
    assert bounded("short") == "short"


def test_every_status_message_is_bounded_whoever_made_it() -> None:
    code, message = status_of(InvalidArgument("x" * MIB))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(message.encode()) <= MAX_MESSAGE_BYTES and message.endswith("characters)")


def test_permission_denied_maps_both_ways() -> None:
    assert PermissionDenied.code == grpc.StatusCode.PERMISSION_DENIED
    assert isinstance(from_code(grpc.StatusCode.PERMISSION_DENIED, "no"), PermissionDenied)


@pytest.mark.parametrize("text", ["a" * MIB, "\x00" * MIB, "日" * MIB])
def test_a_log_line_stays_within_16_kib(text: str) -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "got %s", (text,), None)
    try:
        raise ValueError(text)
    except ValueError as exc:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    line = JsonFormatter("test").format(record)
    assert len(line.encode()) <= 16 * 1024
    assert f"({MIB + 4} characters)" in line, "the message's length is stated"


def test_a_long_traceback_keeps_most_of_its_lines() -> None:
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), None)
    record.exc_info = (ValueError, ValueError("x\n" * 5000), None)
    line = JsonFormatter("test").format(record)
    assert 5000 < len(line.encode()) <= 16 * 1024, "escaped newlines shrink it, not to nothing"
