"""The ports of a running system: what each is called, its stub, a good request for it, and
a watch that good requests keep their normal latency while hostile ones are sent."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import numpy as np

from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.healthcheck import check
from strata.tools.launch import Supervisor, instances
from strata.wire import codec
from tests.support.results import raise_for_result
from tests.support.system import DEFAULT_CONFIG

# Each port's tensor names by pipeline, and a good request for it.
INPUTS = {
    "gateway": {"digits": "images", "tabular": "features"},
    "preprocess": {"digits": "images", "tabular": "features"},
    "inference": {"digits": "pixels", "tabular": "features"},
    "postprocess": {"digits": "logits", "tabular": "logits"},
}
DIGIT = np.eye(8, dtype=np.uint8)[None] * 255
GOOD = {
    "gateway": DIGIT,
    "preprocess": DIGIT,
    "inference": np.linspace(0, 1, 64, dtype=np.float32)[None],
    "postprocess": np.arange(10, dtype=np.float32)[None],
}


def kind(port: str) -> str:
    """gateway, preprocess, inference or postprocess, from an instance name."""
    return port.split("-")[0]


def ports(*kinds: str) -> list[str]:
    """The default deployment's instances of `kinds` (inference-a, preprocess-0, ...)."""
    return [i.name for i in instances(load_settings(DEFAULT_CONFIG)) if kind(i.name) in kinds]


def named(method: str, name: str, version: str = ""):
    """A request of v2 `method` about model `name` at `version`."""
    messages = {
        "ModelInfer": lambda: v2.ModelInferRequest(model_name=name, model_version=version),
        "ModelReady": lambda: v2.ModelReadyRequest(name=name, version=version),
        "ModelMetadata": lambda: v2.ModelMetadataRequest(name=name, version=version),
        "ModelConfig": lambda: v2.ModelConfigRequest(name=name, version=version),
        "ModelStatistics": lambda: v2.ModelStatisticsRequest(name=name, version=version),
        "RepositoryModelLoad": lambda: v2.RepositoryModelLoadRequest(model_name=name),
        "RepositoryModelUnload": lambda: v2.RepositoryModelUnloadRequest(model_name=name),
        "RepositoryIndex": lambda: v2.RepositoryIndexRequest(repository_name=name),
    }
    return messages[method]()


def stub_for(channel: grpc.Channel, port: str):
    stubs = {
        "gateway": v2_grpc.GRPCInferenceServiceStub,
        "inference": v2_grpc.GRPCInferenceServiceStub,
        "preprocess": preprocess_pb2_grpc.PreprocessStub,
        "postprocess": postprocess_pb2_grpc.PostprocessStub,
    }
    return stubs[kind(port)](channel)


def good_item(port: str) -> v1.Request:
    """A good strata.v1 request for a preprocess or postprocess `port`."""
    arrays = {INPUTS[kind(port)]["digits"]: GOOD[kind(port)]}
    return v1.Request(id="good", pipeline="digits", tensors=codec.arrays_to_tensors(arrays))


def good_call(channel: grpc.Channel, port: str) -> Callable[[], object]:
    """A good request to `port`, as a call that raises unless it is answered."""
    stub = stub_for(channel, port)
    if kind(port) in ("gateway", "inference"):
        request = codec.build_request("digits", {INPUTS[kind(port)]["digits"]: GOOD[kind(port)]})
        return lambda: stub.ModelInfer(request, timeout=30)
    call = v1.ProcessRequest(requests=[good_item(port)])
    return lambda: raise_for_result(stub.Process(call, timeout=30).results[0])


# Watching the system while hostile requests are sent.


def assert_serving(system: Supervisor) -> None:
    """Every process still runs and its health service answers SERVING."""
    assert system.failed() is None, f"{system.failed()} exited"
    for name, instance in system.instances.items():
        assert check(instance.listen, timeout=5, tls=system.settings.tls) == "SERVING", name


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


@contextmanager
def watched(system: Supervisor, channel: grpc.Channel, port: str) -> Iterator[None]:
    """While the block runs, a good request goes to `port` again and again from a thread;
    after it, every one must have been answered within max(10 x its P50 measured here first,
    1 s), and every process must still serve."""
    probe = good_call(channel, port)
    normal = statistics.median(_seconds(probe) for _ in range(10))
    limit = max(10 * normal, 1.0)
    stop, times, failures = threading.Event(), [], []

    def keep_probing() -> None:
        while not stop.is_set():
            try:
                times.append(_seconds(probe))
            except Exception as exc:
                failures.append(exc)
            stop.wait(0.01)

    thread = threading.Thread(target=keep_probing, daemon=True)
    thread.start()
    try:
        yield
        while not (times or failures) and thread.is_alive():
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures, f"a good request to {port} failed meanwhile: {failures[0]!r}"
    assert times and max(times) <= limit, (
        f"a good request to {port} took {max(times, default=0):.2f} s meanwhile "
        f"(P50 alone {normal * 1e3:.1f} ms, limit {limit:.2f} s)"
    )
    assert_serving(system)
