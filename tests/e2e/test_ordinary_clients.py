"""An ordinary client, as tritonclient is: one connection, many calls in flight on it. The
gateway queues them at its door and answers; the transport refuses none."""

from __future__ import annotations

import asyncio
import collections

import grpc
import numpy as np

from strata import codec
from strata.launch import Supervisor
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc

IN_FLIGHT = 256


async def one_connection(address: str, calls: int) -> collections.Counter:
    """`calls` digits requests at once on one channel (one HTTP/2 connection)."""
    codes: collections.Counter = collections.Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)

        async def call(i: int) -> None:
            images = np.full((1, 8, 8), i % 256, np.uint8)
            request = codec.build_request("digits", {"images": images})
            try:
                reply = await stub.ModelInfer(request, timeout=30)
                assert reply.outputs, "an answer without outputs"
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[f"{exc.code().name}: {exc.details()}"] += 1

        await asyncio.gather(*(call(i) for i in range(calls)))
    return codes


def test_256_calls_in_flight_on_one_connection_are_all_answered(system: Supervisor) -> None:
    codes = asyncio.run(one_connection(system.address("gateway"), IN_FLIGHT))
    refused = {code: n for code, n in codes.items() if code.startswith("UNAVAILABLE")}
    assert not refused, f"the transport refused calls: {refused}"
    assert codes["OK"] == IN_FLIGHT, f"not every call was answered: {dict(codes)}"
