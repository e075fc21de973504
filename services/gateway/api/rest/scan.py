"""A JSON body's size, nesting and value count, measured before it is parsed.

A parser builds a Python object for every value and recurses once per level, so a small body
can cost far more than its bytes: "[[[[...]]]]" or a million zeros. One vectorised pass over
the bytes counts both (brackets and commas outside strings) in about a millisecond per
megabyte, and a body over the limits is refused before any of it is parsed.
"""

from __future__ import annotations

import re

import numpy as np

from strata.errors import InvalidArgument

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_QUOTE, _COMMA = ord('"'), ord(",")
_STEP = np.zeros(256, dtype=np.int8)  # how each byte changes the nesting depth
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def check_json(body: bytes, max_depth: int, max_values: int) -> None:
    """InvalidArgument when `body` nests deeper than `max_depth` or holds more than
    `max_values` values; bodies that are not JSON at all are left to the parser."""
    if b"\\" in body:  # an escaped quote must not end a string: blank every escape out
        body = _ESCAPE.sub(b"__", body)
    data = np.frombuffer(body, dtype=np.uint8)
    inside = np.bitwise_xor.accumulate((data == _QUOTE).view(np.uint8)).view(bool)
    steps = _STEP[data]
    steps[inside] = 0
    depth = int(np.cumsum(steps, dtype=np.int32).max(initial=0))
    if depth > max_depth:
        raise InvalidArgument(
            f"the JSON body nests {depth} levels deep, more than the limit of {max_depth}"
        )
    values = int(np.count_nonzero((data == _COMMA) & ~inside)) + 1
    if values > max_values:
        raise InvalidArgument(
            f"the JSON body holds about {values} values, more than the limit of "
            f"{max_values}; send large tensors as binary data (binary_data_size)"
        )
