"""Reading strata.v1 results in tests."""

from __future__ import annotations

from strata.errors import from_code
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.codec import Arrays, tensors_to_arrays


def raise_for_result(result: v1.Result) -> Arrays:
    """The tensors of a successful result; the mapped domain error of a failed one."""
    if result.HasField("error"):
        raise from_code(result.error.code, result.error.message)
    return tensors_to_arrays(result.tensors)
