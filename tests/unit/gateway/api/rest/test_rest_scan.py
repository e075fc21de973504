"""The REST body scan: nesting depth and value count measured on the bytes, strings (with
their brackets, commas and escapes) ignored, and exact against the parsed document."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.api.rest.scan import check_json
from strata.errors import InvalidArgument

ROOMY = 1 << 20


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


def leaves_of(value: Any) -> int:
    if isinstance(value, list):
        return sum(map(leaves_of, value))
    if isinstance(value, dict):
        return sum(map(leaves_of, value.values()))
    return 1


def refusal(body: bytes, max_depth: int = ROOMY, max_values: int = ROOMY) -> str:
    with pytest.raises(InvalidArgument) as caught:
        check_json(body, max_depth, max_values)
    return str(caught.value)


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"1", 0),
        (b'"text"', 0),
        (b"[]", 1),
        (b"{}", 1),
        (b'{"a": [1, {"b": [[2]]}]}', 5),
        (b"[[], [[]], [[[]]]]", 4),
        (b'{"inputs": [{"data": [[1, 2], [3, 4]]}]}', 5),
    ],
)
def test_depth_is_exact_at_the_bound(body: bytes, depth: int) -> None:
    check_json(body, depth, ROOMY)
    if depth:
        assert f"nests {depth} levels deep" in refusal(body, max_depth=depth - 1)


@pytest.mark.parametrize(
    "body",
    [
        b'["[[[[[[", "{{{{", "]]]]"]',
        b'["\\"[[[["]',
        b'["\\\\", "\\\\\\"[[[["]',
        b'{"[[[[": "{{{{"}',
        b'["\\u005b[[[", "\\/[[["]',
    ],
)
def test_brackets_inside_strings_do_not_nest(body: bytes) -> None:
    assert depth_of(orjson.loads(body)) == 1
    check_json(body, 1, ROOMY)


def test_an_escaped_backslash_ends_its_string() -> None:
    body = b'["\\\\", [["x"]]]'
    assert depth_of(orjson.loads(body)) == 3
    check_json(body, 3, ROOMY)
    assert "nests 3 levels" in refusal(body, max_depth=2)


@pytest.mark.parametrize(
    ("body", "values"),
    [
        (b"[]", 1),
        (b"[1]", 1),
        (b"[1, 2, 3]", 3),
        (b'{"a": 1, "b": [2, 3]}', 3),
        (b'["a,b,c", "d,e"]', 2),
        (b'["\\",,,", 1]', 2),
    ],
)
def test_values_are_counted_by_commas_outside_strings(body: bytes, values: int) -> None:
    check_json(body, ROOMY, values)
    message = refusal(body, max_values=values - 1)
    assert f"about {values} values" in message and "binary_data_size" in message


def test_one_value_past_the_limit_is_refused() -> None:
    body = orjson.dumps(list(range(1000)))
    check_json(body, 1, 1000)
    assert "limit of 999" in refusal(body, max_values=999)


@pytest.mark.parametrize(
    "body",
    [b"", b"not json at all", b"\x00\xff\xfe\x80", b'"unterminated [[[[', b"]]]]]] [[", b"{"],
)
def test_bodies_that_are_not_json_are_left_to_the_parser(body: bytes) -> None:
    check_json(body, 1, 1)


def test_deep_garbage_is_still_refused_before_parsing() -> None:
    assert "nests 1000 levels" in refusal(b"[" * 1000, max_depth=16)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('[]{},:"\\/ \n\tab\x00é🚀'))
    | st.text()
)
documents = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(alphabet=st.sampled_from('[]{},:"\\x')), children, max_size=5)
    ),
    max_leaves=40,
)


@given(documents)
def test_depth_equals_the_parsed_documents(document: Any) -> None:
    body = orjson.dumps(document)
    depth = depth_of(document)
    check_json(body, depth, ROOMY)
    if depth:
        with pytest.raises(InvalidArgument):
            check_json(body, depth - 1, ROOMY)


@given(documents)
def test_values_never_undercount_the_parsed_leaves(document: Any) -> None:
    body = orjson.dumps(document)
    leaves = leaves_of(document)
    if leaves > 1:
        with pytest.raises(InvalidArgument):
            check_json(body, ROOMY, leaves - 1)
