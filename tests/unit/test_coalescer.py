"""Shared calls to a strata.v1 hop: at once when calls are free, shared when not, each request
answered on its own (services/gateway/coalescer.py), against a real gRPC server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from services.gateway.coalescer import Coalescer
from services.gateway.upstreams import Hop
from strata.config import ServiceEndpoint, load_settings
from strata.errors import DeadlineExceeded
from strata.policies import Coalesce
from strata.proto.v1 import preprocess_pb2_grpc, tensor_pb2
from tests.support.system import make_config


class Recording(preprocess_pb2_grpc.PreprocessServicer):
    """Answers each request with its id; holds calls while `gate` is clear."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.short = False

    async def Process(self, request, context):
        self.calls.append([item.id for item in request.requests])
        await self.gate.wait()
        results = []
        for item in request.requests:
            if item.pipeline == "bad":
                error = tensor_pb2.Error(
                    code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="no"
                )
                results.append(tensor_pb2.Result(id=item.id, error=error))
            else:
                results.append(tensor_pb2.Result(id=item.id, info={"echo": item.id}))
        short = self.short and len(results) > 1
        return tensor_pb2.ProcessResponse(results=results[:-1] if short else results)


def item(name: str, pipeline: str = "digits") -> tensor_pb2.Request:
    return tensor_pb2.Request(id=name, pipeline=pipeline)


def run(tmp_path: Path, scenario, max_calls: int = 1, max_requests: int = 8):
    settings = load_settings(make_config(tmp_path))

    async def go():
        servicer = Recording()
        server = grpc.aio.server()
        preprocess_pb2_grpc.add_PreprocessServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        endpoint = ServiceEndpoint(listen=f"127.0.0.1:{port}")
        hop = Hop("preprocess", endpoint, preprocess_pb2_grpc.PreprocessStub, "x", settings)
        calls = Coalescer(hop, Coalesce(max_calls=max_calls, max_requests=max_requests))
        try:
            return servicer, await scenario(calls, servicer)
        finally:
            await hop.channel.close()
            await server.stop(0)

    return asyncio.run(go())


async def held(servicer: Recording, calls: Coalescer, first: str = "first") -> asyncio.Task:
    """A first call, held on the server so that what follows must queue."""
    servicer.gate.clear()
    task = asyncio.ensure_future(calls.process(item(first), 5))
    while not servicer.calls:
        await asyncio.sleep(0.005)
    return task


def test_a_lone_request_goes_at_once_in_its_own_call(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        return [await calls.process(item(str(i)), 5) for i in range(3)]

    servicer, results = run(tmp_path, scenario)
    assert [r.info["echo"] for r in results] == ["0", "1", "2"]
    assert servicer.calls == [["0"], ["1"], ["2"]]


def test_requests_queued_behind_a_busy_hop_share_the_next_call(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        first = await held(servicer, calls)
        queued = [asyncio.ensure_future(calls.process(item(f"q{i}"), 5)) for i in range(5)]
        await asyncio.sleep(0.05)
        servicer.gate.set()
        return await asyncio.gather(first, *queued)

    servicer, results = run(tmp_path, scenario)
    assert [r.info["echo"] for r in results] == ["first", "q0", "q1", "q2", "q3", "q4"]
    assert servicer.calls == [["first"], ["q0", "q1", "q2", "q3", "q4"]]


def test_a_shared_call_carries_at_most_max_requests(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        first = await held(servicer, calls)
        queued = [asyncio.ensure_future(calls.process(item(f"q{i}"), 5)) for i in range(5)]
        await asyncio.sleep(0.05)
        servicer.gate.set()
        return await asyncio.gather(first, *queued)

    servicer, _ = run(tmp_path, scenario, max_requests=2)
    assert [len(c) for c in servicer.calls] == [1, 2, 2, 1]


def test_a_failing_request_fails_alone_in_a_shared_call(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        first = await held(servicer, calls)
        good = asyncio.ensure_future(calls.process(item("good"), 5))
        bad = asyncio.ensure_future(calls.process(item("bad", pipeline="bad"), 5))
        await asyncio.sleep(0.05)
        servicer.gate.set()
        return await asyncio.gather(first, good, bad)

    servicer, (_, good, bad) = run(tmp_path, scenario)
    assert servicer.calls[1] == ["good", "bad"]
    assert good.info["echo"] == "good" and not good.HasField("error")
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_a_request_whose_budget_ends_while_queued_is_dropped_not_sent(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        first = await held(servicer, calls)
        hasty = asyncio.ensure_future(calls.process(item("hasty"), 0.02))
        patient = asyncio.ensure_future(calls.process(item("patient"), 5))
        with pytest.raises(DeadlineExceeded, match="waiting for preprocess"):
            await hasty
        servicer.gate.set()
        return await asyncio.gather(first, patient)

    servicer, _ = run(tmp_path, scenario)
    assert servicer.calls == [["first"], ["patient"]]


def test_a_cancelled_caller_leaves_the_queue(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        first = await held(servicer, calls)
        gone = asyncio.ensure_future(calls.process(item("gone"), 5))
        stays = asyncio.ensure_future(calls.process(item("stays"), 5))
        await asyncio.sleep(0.02)
        gone.cancel()
        servicer.gate.set()
        return await asyncio.gather(first, stays)

    servicer, _ = run(tmp_path, scenario)
    assert servicer.calls == [["first"], ["stays"]]


def test_a_broken_reply_fails_every_request_of_its_call_and_no_other(tmp_path: Path) -> None:
    async def scenario(calls, servicer):
        first = await held(servicer, calls)
        queued = [asyncio.ensure_future(calls.process(item(f"q{i}"), 5)) for i in range(3)]
        await asyncio.sleep(0.02)
        servicer.short = True  # the shared call's reply lacks a result
        servicer.gate.set()
        return await asyncio.gather(first, *queued, return_exceptions=True)

    _, results = run(tmp_path, scenario)
    assert results[0].info["echo"] == "first"
    for result in results[1:]:
        assert isinstance(result, RuntimeError) and "2 results for 3 requests" in str(result)
