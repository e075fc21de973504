"""A decoupled pipeline as tritonclient drives Triton's repeat_int32 (qa/L0_decoupled): on
one stream, each request answered with its k responses (0, 1 or 5) in order and carrying its
id, OUT = IN[i] and IDX = i, with Triton's final flags where the request asks; unary calls
refused naming the stream method; a bad request, one past the response limit, or one asking
for outputs in shared memory, failing alone; a client that stops reading held to the
stream's bound; and a killed inference replica ending the request with UNAVAILABLE."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from models import repeat
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import DEFAULT_CONFIG, run_client, running_system

SHIPPED = yaml.safe_load((DEFAULT_CONFIG.parent / "decoupled.yaml").read_text())
MAX_RESPONSES = 8
STEADY_TRIES = 30  # seconds for a stream nobody reads to reach its bound
# The shipped demo pipeline, with a response limit below what its inputs allow, so that
# the limit itself is reached.
REPEAT = {**SHIPPED["pipelines"]["repeat"], "decoupled": {"max_responses": MAX_RESPONSES}}


def repository(folder: Path) -> Path:
    """The demo repository's models, and the repeat model built here."""
    demo = DEFAULT_CONFIG.parent / yaml.safe_load(DEFAULT_CONFIG.read_text())["repository"]
    root = folder / "repository"
    root.mkdir()
    for model in ("digits", "tabular", "digits-large"):
        (root / model).symlink_to(demo.resolve() / model)
    repeat.write(folder)
    return root


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    folder = tmp_path_factory.mktemp("decoupled")
    changes = {"repository": str(repository(folder)), "pipelines": {"repeat": REPEAT}}
    with running_system(folder, changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def report(system: Supervisor) -> dict[str, Any]:
    gateway = system.settings.services.gateway
    return run_client(
        "triton_decoupled", gateway.listen, gateway.rest, "repeat", str(MAX_RESPONSES)
    )


def test_the_model_config_says_decoupled(report: dict[str, Any]) -> None:
    for config in report["config"].values():
        assert config["model_transaction_policy"] == {"decoupled": True}
        assert int(config.get("max_batch_size", 0)) == 0  # gRPC JSON leaves a 0 out
        assert [(o["name"], [int(d) for d in o["dims"]]) for o in config["output"]] == [
            ("OUT", [1]),
            ("IDX", [1]),
        ]


@pytest.mark.parametrize("requests", [1, 5])
@pytest.mark.parametrize("repeats", [0, 1, 5])
@pytest.mark.parametrize("final", [False, True])
def test_each_request_gets_its_responses_in_order(
    report: dict[str, Any], requests: int, repeats: int, final: bool
) -> None:
    got = report["streams"][f"{requests}x{repeats}" + (" final" if final else "")]
    assert not [r for r in got if "error" in r], got
    assert sorted({r["id"] for r in got}) == ([str(i) for i in range(requests)] if got else [])
    for i in range(requests):
        mine = [r for r in got if r["id"] == str(i)]
        data = mine[:-1] if final else mine
        assert [r["OUT"] for r in data] == [[100 + j] for j in range(repeats)]
        assert [r["IDX"] for r in data] == [[j] for j in range(repeats)]
        if final:
            assert [r["final"] for r in data] == [False] * repeats
            assert mine[-1] == {"id": str(i), "OUT": None, "IDX": None, "final": True}
        else:
            assert {r["final"] for r in mine} <= {None}  # no flag unless asked


def test_unary_inference_is_refused_naming_the_stream_method(report: dict[str, Any]) -> None:
    statuses = {"grpc": "StatusCode.INVALID_ARGUMENT", "http": "400"}
    for protocol, refusal in report["unary"].items():
        assert refusal["status"] == statuses[protocol], refusal
        assert "doesn't support models with decoupled transaction policy" in refusal["message"]
        assert "ModelStreamInfer" in refusal["message"]


def test_a_failed_request_gets_its_error_and_the_stream_goes_on(report: dict[str, Any]) -> None:
    got = report["one_bad"]
    (error,) = [r for r in got if "error" in r]
    assert "INVALID_ARGUMENT" in error["error"] and "DELAY" in error["error"], error
    good = [r for r in got if r.get("id") == "good"]
    assert [(r["OUT"], r["final"]) for r in good] == [([100], False), ([101], False), (None, True)]


def test_outputs_into_shared_memory_are_refused(report: dict[str, Any]) -> None:
    assert "is decoupled: its responses' outputs cannot go to shared memory" in (
        report["shared_memory"] or ""
    )


def test_an_answer_past_the_response_limit_is_refused(report: dict[str, Any]) -> None:
    (refusal,) = report["too_many"]
    assert "INVALID_ARGUMENT" in refusal["error"]
    assert f"{MAX_RESPONSES + 1} responses, more than the {MAX_RESPONSES}" in refusal["error"]


def answered(stub: v2_grpc.GRPCInferenceServiceStub) -> int:
    """The repeat requests the gateway has answered so far."""
    statistics = stub.ModelStatistics(v2.ModelStatisticsRequest(name="repeat"), timeout=10)
    return statistics.model_stats[0].inference_stats.success.count


def test_a_stream_whose_client_stops_reading_stays_bounded(system: Supervisor) -> None:
    """A client that writes requests of the most responses and never reads: the gateway
    answers the stream's max_stream_in_flight requests and those whose responses HTTP/2
    flow control took, then stops reading it; its other clients are served all the while."""
    address = system.address("gateway")
    options = [("grpc.http2.bdp_probe", 0)]  # the client's window stays HTTP/2's 64 KiB

    async def go() -> tuple[int, int, int]:
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = v2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
            written = 0

            async def write() -> None:
                nonlocal written
                for i in itertools.count():
                    await call.write(repeat_request(f"w{i}", MAX_RESPONSES))
                    written += 1

            writer = asyncio.ensure_future(write())
            with grpc.insecure_channel(address) as other:
                stub = v2_grpc.GRPCInferenceServiceStub(other)
                # Until the count holds for a second: a busy machine takes longer to reach
                # the bound; a gateway that never stops reading never holds.
                first, later = -1, await asyncio.to_thread(answered, stub)
                for _ in range(STEADY_TRIES):
                    if later == first:
                        break
                    await asyncio.sleep(1.0)
                    first, later = later, await asyncio.to_thread(answered, stub)
            writer.cancel()
            call.cancel()
        return written, first, later

    before = answered(v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address)))
    written, first, later = asyncio.run(go())
    held = later - before
    size = repeat_request("w0", MAX_RESPONSES).ByteSize()
    print(f"written {written} requests of {size} bytes, answered {held}")
    assert later == first, "the gateway kept reading a stream nobody reads"
    in_flight = system.settings.server.max_stream_in_flight
    # 64 KiB of flow-control window holds well under 100 requests' 8 responses each.
    assert held <= in_flight + 100
    # Flow control stopped the writer: what waits in HTTP/2's buffers, as on any stream.
    assert written * size < 32 << 20


def repeat_request(request_id: str, length: int) -> v2.ModelInferRequest:
    arrays = {
        "IN": np.arange(length, dtype=np.int32),
        "DELAY": np.zeros(length, np.uint32),
        "WAIT": np.zeros(1, np.uint32),
    }
    return codec.build_request("repeat", arrays, request_id=request_id)


def test_a_killed_replica_ends_the_request_with_unavailable(system: Supervisor) -> None:
    """Last in this module: deployment a, which serves repeat, is killed."""
    system.stop("inference-a", signal.SIGKILL)
    request = repeat_request("after-kill", 3)
    with grpc.insecure_channel(system.address("gateway")) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        replies = list(stub.ModelStreamInfer(iter([request]), timeout=30))
    assert len(replies) == 1, replies
    (reply,) = replies
    assert reply.error_message.startswith("UNAVAILABLE: "), reply.error_message
    assert "'repeat'" in reply.error_message, reply.error_message
    assert reply.infer_response == v2.ModelInferResponse(model_name="repeat", id="after-kill")
