"""The inference service on a real gRPC server in process, over a toy repository: batching
under load, limits and their codes, failure isolation, statistics, and hot swap under load."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from services.gateway.flow.flights import Member
from services.gateway.flow.model_calls import model_request
from services.gateway.request import ClientRequest
from services.inference.app import build
from strata.config import load_settings
from strata.config.pipelines import Pipeline
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.rpc.server import start_server
from strata.wire import codec, flight
from strata.wire.deadline import Deadline
from tests.support.system import endpoint
from tests.unit.inference.test_inference_toymodels import (
    dense,
    pooling_model,
    run,
    tokens,
    write_case,
    write_version,
)

TOKEN = "test-inference-token-of-at-least-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
X = {"x": np.ones((1, 4), np.float32)}
HEAVY = {"x": np.ones((1, 512), np.float32)}
TOY_PIPELINE = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
}


@contextmanager
def inference_server(folder: Path, models: list[str], **inference: Any) -> Iterator[Any]:
    """The inference service alone, on a free port, serving `models` from `folder/repo`;
    the repository API (index, load, unload) takes TOKEN unless `admin_token` says otherwise."""
    raw = {
        "services": {
            "gateway": endpoint(),
            "preprocess": endpoint(),
            "postprocess": endpoint(),
            "inference": {"a": endpoint()},
        },
        "repository": str(folder / "repo"),
        "inference": {"models": models, "admin_token": TOKEN, **inference},
        "pipelines": {"toy": {**TOY_PIPELINE, "model": {"name": models[0]}}},
    }
    path = folder / "strata.yaml"
    path.write_text(yaml.safe_dump(raw))
    settings = load_settings(path)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple:
        service = await build(settings)
        listen = service.endpoint.listen
        return await start_server(service.registrations, listen, settings.server), service

    running, service = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
    channel = grpc.insecure_channel(settings.services.primary_inference.listen)
    try:
        yield v2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()

        async def stop() -> None:
            await running.server.stop(0)
            await service.on_stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def infer(stub: Any, model: str, arrays: dict, **parameters: Any) -> v2.ModelInferResponse:
    request = codec.build_request(model, arrays)
    for key, value in parameters.items():
        field = "bool_param" if isinstance(value, bool) else "int64_param"
        field = "string_param" if isinstance(value, str) else field
        setattr(request.parameters[key], field, value)
    return stub.ModelInfer(request, timeout=30)


def statistics(stub: Any, model: str) -> v2.ModelStatistics:
    (stats,) = stub.ModelStatistics(v2.ModelStatisticsRequest(name=model)).model_stats
    return stats


def batch_sizes(stub: Any, model: str) -> set[int]:
    return {b.batch_size for b in statistics(stub, model).batch_stats}


def code_of(call: Any) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_batches_form_under_concurrent_load_and_not_one_at_a_time(tmp_path: Path) -> None:
    heavy = dense(1, features=512, classes=3, hidden=8192)
    write_version(tmp_path / "repo", "heavy", 1, heavy, [HEAVY], {"max_batch_size": 8})
    expected = run(heavy, HEAVY)["y"]
    with inference_server(tmp_path, ["heavy"], workers=1) as stub:
        warm = statistics(stub, "heavy").execution_count
        for _ in range(10):
            infer(stub, "heavy", HEAVY)
        assert batch_sizes(stub, "heavy") == {1}
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda _: infer(stub, "heavy", HEAVY), range(160)))
        for reply in replies:
            np.testing.assert_allclose(codec.response_outputs(reply)["y"], expected, rtol=1e-4)
        sizes = batch_sizes(stub, "heavy")
        stats = statistics(stub, "heavy")
    assert max(sizes) > 1 and max(sizes) <= 8
    assert stats.inference_count == 170
    assert warm == 0 and stats.execution_count < 170
    assert stats.inference_stats.queue.count == 170
    assert sum(b.compute_infer.count for b in stats.batch_stats) == stats.execution_count
    assert stats.response_stats["strata.queue"].success.count == 0


def test_limits_answer_with_their_codes(tmp_path: Path) -> None:
    heavy = dense(1, features=512, classes=3, hidden=8192)
    manifest = {"batching": {"max_queue_rows": 2, "policy": "none"}}
    write_version(tmp_path / "repo", "heavy", 1, heavy, [HEAVY], manifest)
    with inference_server(tmp_path, ["heavy"], workers=1) as stub:
        expired = code_of(lambda: infer(stub, "heavy", HEAVY, timeout=1))
        bad = code_of(lambda: infer(stub, "heavy", HEAVY, priority="high"))
        too_high = code_of(lambda: infer(stub, "heavy", HEAVY, priority=9))
        with ThreadPoolExecutor(24) as pool:
            calls = [lambda: infer(stub, "heavy", HEAVY)] * 96
            codes = list(pool.map(code_of, calls))
        stats = statistics(stub, "heavy")
    assert expired == grpc.StatusCode.DEADLINE_EXCEEDED
    assert bad == too_high == grpc.StatusCode.INVALID_ARGUMENT
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    refused = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert stats.response_stats["strata.rejected.queue_full"].fail.count == refused
    assert stats.response_stats["strata.rejected.deadline"].fail.count == 1


def test_a_poisoned_request_in_a_batch_fails_alone(tmp_path: Path) -> None:
    manifest = {
        "padding": {"ids": 0, "mask": 0},
        # A window the six callers reach together even on a loaded machine.
        "batching": {"policy": "fixed", "max_queue_delay_ms": 500},
    }
    write_version(tmp_path / "repo", "pool", 1, pooling_model(), tokens([2, 4]), manifest)
    requests = tokens([3, 5, 2, 6, 4, 1], seed=3)
    requests[2] = {"ids": np.array([[1, 99]], np.int64), "mask": np.ones((1, 2), np.float32)}
    with inference_server(tmp_path, ["pool"]) as stub:
        before = statistics(stub, "pool").execution_count
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(infer, stub, "pool", r) for r in requests]
            outcomes = [f.exception() or f.result() for f in futures]
        sizes = batch_sizes(stub, "pool")
        after = statistics(stub, "pool").execution_count
    assert isinstance(outcomes[2], grpc.RpcError)
    assert outcomes[2].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot run the request" in outcomes[2].details()
    for i, outcome in enumerate(outcomes):
        if i != 2:
            pooled = codec.response_outputs(outcome)["pooled"]
            np.testing.assert_allclose(pooled, run(pooling_model(), requests[i])["pooled"], 1e-5)
    assert max(sizes) >= 2 and after - before < len(requests)


@pytest.mark.timing
def test_skip_batching_does_not_wait_for_the_window(tmp_path: Path) -> None:
    manifest = {"batching": {"policy": "fixed", "max_queue_delay_ms": 400}}
    write_version(tmp_path / "repo", "toy", 1, dense(1), [X], manifest)
    with inference_server(tmp_path, ["toy"]) as stub:
        start = time.perf_counter()
        infer(stub, "toy", X, skip_batching=True)
        skipped = time.perf_counter() - start
        start = time.perf_counter()
        infer(stub, "toy", X)
        windowed = time.perf_counter() - start
        bad = code_of(lambda: infer(stub, "toy", X, skip_batching=1))
    assert skipped < 0.3 and windowed >= 0.4
    assert bad == grpc.StatusCode.INVALID_ARGUMENT


def test_a_swap_under_load_loses_nothing_and_changes_the_answers(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_version(repo, "toy", 1, dense(1), [X])
    answers = {v: run(dense(v), X)["y"] for v in (1, 2)}
    seen: list[tuple[float, str, np.ndarray]] = []
    errors: list[str] = []
    stop = threading.Event()
    with inference_server(tmp_path, ["toy"]) as stub:

        def load() -> None:
            while not stop.is_set():
                start = time.monotonic()
                try:
                    reply = infer(stub, "toy", X)
                except grpc.RpcError as exc:
                    errors.append(f"{exc.code()}: {exc.details()}")
                    continue
                seen.append((start, reply.model_version, codec.response_outputs(reply)["y"]))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        write_version(repo, "toy", 2, dense(2), [X])
        stub.RepositoryModelLoad(v2.RepositoryModelLoadRequest(model_name="toy"), metadata=AUTH)
        swapped = time.monotonic()
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join()
        index = stub.RepositoryIndex(v2.RepositoryIndexRequest(), metadata=AUTH).models
    assert errors == []
    assert {version for _, version, _ in seen} == {"1", "2"}
    for start, version, y in seen:
        np.testing.assert_allclose(y, answers[int(version)], rtol=1e-5)
        if start > swapped:
            assert version == "2"
    assert [(m.version, m.state) for m in index] == [("1", "UNAVAILABLE"), ("2", "READY")]


def test_broken_versions_are_refused_while_the_old_keeps_serving(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_version(repo, "toy", 1, dense(1), [X])
    with inference_server(tmp_path, ["toy"]) as stub:
        corrupt = write_version(repo, "toy", 2, dense(2), [X])
        (corrupt / "model.onnx").write_bytes(b"not an onnx model")
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(v2.RepositoryModelLoadRequest(model_name="toy"), metadata=AUTH)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "version 2 refused: cannot open model.onnx" in info.value.details()
        assert infer(stub, "toy", X).model_version == "1"

        failing = write_version(repo, "toy", 3, dense(3), [X])
        write_case(failing / "validation" / "case_000.npz", X, run(dense(4), X))
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(v2.RepositoryModelLoadRequest(model_name="toy"), metadata=AUTH)
        assert "validation case 'case_000' output 'y' differs" in info.value.details()
        assert "version 1 keeps serving" in info.value.details()
        assert infer(stub, "toy", X).model_version == "1"
        override = v2.RepositoryModelLoadRequest(model_name="toy")
        override.parameters["config"].string_param = '{"max_batch_size": 4}'
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(override, metadata=AUTH)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "['config'] are not supported" in info.value.details()
        listed = stub.RepositoryIndex(v2.RepositoryIndexRequest(), metadata=AUTH).models
        index = {m.version: m for m in listed}
        ready = stub.RepositoryIndex(v2.RepositoryIndexRequest(ready=True), metadata=AUTH).models

        stub.RepositoryModelUnload(v2.RepositoryModelUnloadRequest(model_name="toy"), metadata=AUTH)
        unloaded = code_of(lambda: infer(stub, "toy", X))
        not_ready = stub.ModelReady(v2.ModelReadyRequest(name="toy")).ready
    assert index["1"].state == "READY"
    assert index["2"].state == "UNAVAILABLE" and "cannot open" in index["2"].reason
    assert index["3"].state == "UNAVAILABLE" and "case_000" in index["3"].reason
    assert [m.version for m in ready] == ["1"]
    assert unloaded == grpc.StatusCode.UNAVAILABLE and not not_ready


def test_the_repository_api_needs_the_token_and_readiness_follows_it(tmp_path: Path) -> None:
    write_version(tmp_path / "repo", "toy", 1, dense(1), [X])
    unload = v2.RepositoryModelUnloadRequest(model_name="toy")
    load = v2.RepositoryModelLoadRequest(model_name="toy")
    index = v2.RepositoryIndexRequest()
    wrong = (("authorization", "Bearer not-the-token"),)
    with inference_server(tmp_path, ["toy"]) as stub:
        calls = ((stub.RepositoryModelUnload, unload), (stub.RepositoryIndex, index))
        refused = [
            code_of(lambda m=m, call=call, request=request: call(request, metadata=m))
            for call, request in calls
            for m in ((), wrong)
        ]
        assert stub.ServerReady(v2.ServerReadyRequest()).ready
        stub.RepositoryModelUnload(unload, metadata=AUTH)
        gone = (
            stub.ServerReady(v2.ServerReadyRequest()).ready,
            stub.ModelReady(v2.ModelReadyRequest(name="toy")).ready,
        )
        with pytest.raises(grpc.RpcError) as info:
            infer(stub, "toy", X)
        stub.RepositoryModelLoad(load, metadata=AUTH)
        back = stub.ServerReady(v2.ServerReadyRequest()).ready
        answer = infer(stub, "toy", X).model_version
    assert refused == [grpc.StatusCode.UNAUTHENTICATED] * 4
    assert gone == (False, False)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "not loaded" in info.value.details() and "another replica" in info.value.details()
    assert back and answer == "1"


def test_without_a_token_the_repository_api_is_off(tmp_path: Path) -> None:
    write_version(tmp_path / "repo", "toy", 1, dense(1), [X])
    with inference_server(tmp_path, ["toy"], admin_token=None) as stub:
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelUnload(
                v2.RepositoryModelUnloadRequest(model_name="toy"), metadata=AUTH
            )
        listed = code_of(lambda: stub.RepositoryIndex(v2.RepositoryIndexRequest()))
        served = infer(stub, "toy", X).model_version
    assert listed == grpc.StatusCode.PERMISSION_DENIED
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "inference.admin_token" in info.value.details() and TOKEN not in info.value.details()
    assert served == "1"


def test_the_stream_answers_each_request_batched_and_reports_bad_ones(tmp_path: Path) -> None:
    heavy = dense(1, features=512, classes=3, hidden=8192)
    write_version(tmp_path / "repo", "heavy", 1, heavy, [HEAVY], {"max_batch_size": 8})
    expected = run(heavy, HEAVY)["y"]
    requests = []
    for i in range(24):
        arrays = HEAVY if i % 6 else {"x": np.ones((1, 3), np.float32)}  # every sixth: bad shape
        request = codec.build_request("heavy", arrays)
        request.id = str(i)
        requests.append(request)
    with inference_server(tmp_path, ["heavy"], workers=1) as stub:
        answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
        sizes = batch_sizes(stub, "heavy")
    assert sorted(int(a.infer_response.id) for a in answers) == list(range(24))
    bad = {a.infer_response.id: a.error_message for a in answers if a.error_message}
    assert set(bad) == {"0", "6", "12", "18"}
    assert all(m.startswith("INVALID_ARGUMENT: ") and "shape" in m for m in bad.values())
    for answer in answers:
        if not answer.error_message:
            y = codec.response_outputs(answer.infer_response)["y"]
            np.testing.assert_allclose(y, expected, rtol=1e-4)
    assert max(sizes) > 1, "requests of one stream share batches"


def flight_request(model: str, members: list[dict], **parameters: str) -> v2.ModelInferRequest:
    """One v2 request over the members' stacked rows, as the gateway sends a flight."""
    stacked = {name: np.concatenate([m[name] for m in members]) for name in members[0]}
    request = codec.build_request(model, stacked)
    rows = ",".join(str(len(next(iter(m.values())))) for m in members)
    request.parameters[flight.ROWS].string_param = rows
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    return request


def test_a_flight_queues_each_member_as_its_own_request(tmp_path: Path) -> None:
    manifest = {"padding": {"ids": 0, "mask": 0}}
    write_version(tmp_path / "repo", "pool", 1, pooling_model(), tokens([2, 4]), manifest)
    members = tokens([4, 4, 4, 4, 4], seed=5)
    members[2] = {"ids": np.array([[1, 99, 2, 3]], np.int64), "mask": np.ones((1, 4), np.float32)}
    members[1] = {name: np.concatenate([a, a]) for name, a in members[1].items()}  # two rows
    timeouts = ",".join(["5000000", "5000000", "5000000", "1", "5000000"])
    request = flight_request("pool", members, **{flight.TIMEOUTS: timeouts})
    with inference_server(tmp_path, ["pool"]) as stub:
        before = statistics(stub, "pool").inference_stats
        reply = stub.ModelInfer(request, timeout=30)
        after = statistics(stub, "pool").inference_stats
    errors = flight.member_errors(reply.parameters, len(members))
    assert sorted(errors) == [2, 3]
    assert errors[2].code == grpc.StatusCode.INVALID_ARGUMENT
    assert errors[3].code == grpc.StatusCode.DEADLINE_EXCEEDED
    pooled = codec.response_outputs(reply)["pooled"]
    expected = np.concatenate([run(pooling_model(), members[i])["pooled"] for i in (0, 1, 4)])
    np.testing.assert_allclose(pooled, expected, rtol=1e-5)
    assert after.success.count - before.success.count == 3, "each member is a request"
    assert after.fail.count - before.fail.count == 1


def test_each_members_own_deadline_survives_a_flight_from_the_gateway(tmp_path: Path) -> None:
    """The gateway writes a flight (model_calls.model_request) of members with deadlines of their
    own; inference queues each by its own: the one whose deadline passed fails alone, though
    the call's gRPC deadline is long."""
    write_version(tmp_path / "repo", "toy", 1, dense(1), [X])
    pipeline = Pipeline.model_validate({**TOY_PIPELINE, "model": {"name": "toy"}})
    arrays = [{"x": np.full((1, 4), i, np.float32)} for i in range(3)]
    members = []
    for i, seconds in enumerate((30.0, -1.0, 30.0)):
        deadline = Deadline.after(seconds)
        request = ClientRequest("toy", pipeline, arrays[i], [], f"r{i}", "c", "", deadline)
        members.append(Member(request, 1, deadline))
    features = codec.arrays_to_tensors({"x": np.concatenate([a["x"] for a in arrays])})
    request = model_request("toy", "", members, [1, 1, 1], features)
    with inference_server(tmp_path, ["toy"]) as stub:
        reply = stub.ModelInfer(request, timeout=30)
    errors = flight.member_errors(reply.parameters, len(members))
    assert list(errors) == [1]
    assert errors[1].code == grpc.StatusCode.DEADLINE_EXCEEDED
    expected = np.concatenate([run(dense(1), arrays[i])["y"] for i in (0, 2)])
    np.testing.assert_allclose(codec.response_outputs(reply)["y"], expected, rtol=1e-5)


def test_a_flight_whose_rows_do_not_add_up_is_refused(tmp_path: Path) -> None:
    write_version(tmp_path / "repo", "pool", 1, pooling_model(), tokens([2, 4]), {})
    request = flight_request("pool", tokens([3, 3], seed=1))
    request.parameters[flight.ROWS].string_param = "1,2"
    with inference_server(tmp_path, ["pool"]) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert flight.ROWS in raised.value.details()


@pytest.mark.timing
def test_a_flight_that_skips_batching_runs_as_one_batch_at_once(tmp_path: Path) -> None:
    manifest = {"batching": {"policy": "fixed", "max_queue_delay_ms": 400}}
    write_version(tmp_path / "repo", "toy", 1, dense(1), [X], manifest)
    members = [{"x": np.full((1, 4), i, np.float32)} for i in range(3)]
    request = flight_request("toy", members)
    request.parameters["skip_batching"].bool_param = True
    with inference_server(tmp_path, ["toy"]) as stub:
        start = time.perf_counter()
        reply = stub.ModelInfer(request, timeout=30)
        seconds = time.perf_counter() - start
        sizes = batch_sizes(stub, "toy")
    expected = np.concatenate([run(dense(1), m)["y"] for m in members])
    np.testing.assert_allclose(codec.response_outputs(reply)["y"], expected, rtol=1e-5)
    assert seconds < 0.3 and sizes == {3}
