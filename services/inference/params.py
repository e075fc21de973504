"""The v2 request parameters the inference service honours.

- `priority` (int): 1 is served first, higher numbers later; 0 or absent is the model's
  default level (as in Triton).
- `timeout` (int, microseconds): the request's own time budget; the gRPC deadline, when
  shorter, wins. 0 or absent means none.
- `skip_batching` (bool): run this request alone at the next free worker slot instead of
  waiting for a batch (the gateway sets it on its second degradation level).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.inference.jobs import Request
from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.deadline import Deadline, earliest
from strata.wire.triton_sequences import flag

PRIORITY, TIMEOUT, SKIP_BATCHING = "priority", "timeout", "skip_batching"


def request_options(parameters: Mapping[str, v2.InferParameter], call: Deadline | None) -> Request:
    """The queueing options of one request; `call`: the call's own deadline (None for none)."""
    return Request(
        priority=_integer(parameters, PRIORITY),
        deadline=earliest(call, Deadline.from_us(_integer(parameters, TIMEOUT))),
        skip_batching=flag(parameters, SKIP_BATCHING),
    )


def _integer(parameters: Mapping[str, v2.InferParameter], name: str) -> int:
    if name not in parameters:
        return 0
    param = parameters[name]
    kind = param.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidArgument(f"parameter {name!r} must be an integer, got {kind or 'nothing'}")
    value = param.int64_param if kind == "int64_param" else param.uint64_param
    if value < 0:
        raise InvalidArgument(f"parameter {name!r} must not be negative, got {value}")
    return value
