"""Small real parts for the flow's unit tests: pipelines, flight members, and model servers
that stand at the far end of the gateway's hops (the network is what they replace: what
they answer is computed from the request, as a model server's is).

A `Server` answers ModelInfer as the inference layer does for a flight: each member's rows
through its function, except the members it is told to fail, which get their own error in
the reply's parameters (strata.wire.flight) and no rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.gateway.flow.flights import Member
from services.gateway.request import ClientRequest
from strata.config.pipelines import Pipeline, Route
from strata.errors import StrataError
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec, flight
from strata.wire.deadline import Deadline

Model = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def doubled(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A model: `y` is twice `x`."""
    return {"y": inputs["x"] * 2}


@dataclass
class Server:
    """A model server behind one hop: `model` over each request's rows; `error` for the
    whole call where set; `failing`: members (by index in the call) refused with their
    own error; `malformed`: its replies break the protocol (each output's raw contents
    shorter than its shape). Keeps every request it was sent, with its `spare`."""

    model: Model = doubled
    error: StrataError | None = None
    failing: dict[int, StrataError] = field(default_factory=dict)
    delay: float = 0.0
    malformed: bool = False
    requests: list[v2.ModelInferRequest] = field(default_factory=list)
    spares: list[bool | None] = field(default_factory=list)

    async def call(
        self, method: str, request: Any, deadline: Deadline, spare: bool | None = None
    ) -> v2.ModelInferResponse:
        assert method == "ModelInfer"
        self.requests.append(request)
        self.spares.append(spare)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        inputs = codec.request_inputs(request)
        total = len(next(iter(inputs.values())))
        rows = [total]
        if flight.is_flight(request.parameters):
            rows = [m.rows for m in flight.members(request.parameters, total)]
        starts = np.cumsum([0, *rows])
        kept = [i for i in range(len(rows)) if i not in self.failing]
        taken = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in kept] or [[]])
        outputs = self.model({name: array[taken.astype(int)] for name, array in inputs.items()})
        reply = v2.ModelInferResponse(model_name=request.model_name, model_version="7")
        codec.add_outputs(reply, outputs)
        flight.set_errors(reply.parameters, self.failing)
        if self.malformed:
            reply.raw_output_contents[0] = reply.raw_output_contents[0][:-1]
        return reply


class Deployments:
    """The inference deployments, by name, as the gateway's upstreams hold them."""

    def __init__(self, **servers: Server) -> None:
        self.inference = servers

    def inference_hop(self, deployment: str, sequence: object = None) -> Server:
        return self.inference[deployment]


def routes(*arms: str) -> list[Route]:
    """An arm per name, each on its own deployment (`d-<arm>`)."""
    return [Route(arm=arm, deployment=f"d-{arm}", weight=1.0) for arm in arms]


def pipeline(**extra: Any) -> Pipeline:
    """A pipeline of model `small` (x in, y out) on arms a and b, with `extra` fields."""
    spec = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
        "model": {"name": "small", "routes": [r.model_dump() for r in routes("a", "b")]},
        **extra,
    }
    return Pipeline.model_validate(spec)


def member(
    request_id: str,
    rows: int,
    spec: Pipeline | None = None,
    seconds: float = 5.0,
    client: str = "",
    forced_arm: str = "",
    **fields: Any,
) -> Member:
    """A member of `rows` rows of pipeline `p` (`spec`), its future made on the running
    loop, with `seconds` left."""
    request = ClientRequest(
        pipeline_name="p",
        pipeline=spec or pipeline(),
        arrays={},
        inputs=[],
        request_id=request_id,
        client=client or request_id,
        forced_arm=forced_arm,
        deadline=Deadline.after(seconds),
        **fields,
    )
    made = Member(request, rows, request.deadline)
    made.future = asyncio.get_running_loop().create_future()
    return made


def rows_of(count: int, start: float = 0.0) -> np.ndarray:
    """`count` rows of x, each one's values telling it apart."""
    return (np.arange(count * 2, dtype=np.float32).reshape(count, 2) + start).astype(np.float32)
