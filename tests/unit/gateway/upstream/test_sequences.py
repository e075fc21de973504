"""The gateway's side of sequences without sockets: a sequence's arm is the one its START
was answered on, each request is one row, and flags on a stateless pipeline are refused."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.gateway.request import Answer, ClientRequest
from services.gateway.upstream.sequences import Sequences, replica, request_flags
from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.deadline import Deadline
from strata.wire.triton_sequences import Flags

SPEC = {
    "inputs": [{"name": "value", "datatype": "FP32", "shape": [-1, 1]}],
    "outputs": [{"name": "total", "datatype": "FP32", "shape": [-1, 1]}],
    "model": {"name": "accumulator"},
}
STATEFUL = Pipeline.model_validate({**SPEC, "sequence": {}})
STATELESS = Pipeline.model_validate(SPEC)


def client_request(rows: int = 1) -> ClientRequest:
    value = np.ones((rows, 1), np.float32)
    return ClientRequest(
        "counter", STATEFUL, {"value": value}, [], "", "c", "", Deadline.after(5.0)
    )


def test_the_rest_of_a_sequence_goes_to_the_arm_its_start_was_answered_on() -> None:
    sequences = Sequences()
    forced: list[str] = []

    def infer_on(arm: str):
        async def infer(req: ClientRequest) -> Answer:
            forced.append(req.forced_arm)
            return Answer({}, arm, "1", 0)

        return infer

    async def run() -> None:
        start, going = Flags(1, start=True, scope="c"), Flags(1, scope="c")
        await sequences.infer(client_request(), start, infer_on("canary"))
        await sequences.infer(client_request(), going, infer_on("canary"))
        await sequences.infer(client_request(), start, infer_on("control"))  # over again
        await sequences.infer(client_request(), going, infer_on("control"))

    asyncio.run(run())
    assert forced == ["", "canary", "", "control"]


def test_a_request_of_a_sequence_holds_one_row() -> None:
    async def never(req: ClientRequest) -> Answer:
        raise AssertionError("refused before it is sent")

    with pytest.raises(InvalidArgument, match=r"holds one row .* got \[3\]"):
        asyncio.run(Sequences().infer(client_request(3), Flags(1, start=True), never))


def request(**flags: object) -> v2.ModelInferRequest:
    message = v2.ModelInferRequest(model_name="counter")
    for key, value in flags.items():
        field = {bool: "bool_param", int: "uint64_param"}[type(value)]
        setattr(message.parameters[key], field, value)
    return message


def test_flags_are_the_clients_own() -> None:
    sent = request(sequence_id=9, sequence_start=True)
    sent.parameters["strata.sequence_scope"].string_param = "someone else"
    assert request_flags(sent, STATEFUL, "c") == Flags(9, start=True, scope="c")


def test_flags_on_a_stateless_pipeline_and_none_on_a_stateful_one_are_refused() -> None:
    assert request_flags(request(), STATELESS, "c") is None
    with pytest.raises(InvalidArgument, match="is stateless: it takes no sequence"):
        request_flags(request(sequence_end=True), STATELESS, "c")
    with pytest.raises(InvalidArgument, match="is stateful: each request belongs to a sequence"):
        request_flags(request(), STATEFUL, "c")


def test_a_sequence_has_one_replica_whichever_gateway_asks() -> None:
    picks = {replica(Flags(i, scope="c"), 3) for i in range(1, 50)}
    assert picks == {0, 1, 2}
    assert replica(Flags(7, scope="c"), 3) == replica(Flags(7, scope="c"), 3)
