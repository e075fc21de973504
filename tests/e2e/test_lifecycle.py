"""Health and clean shutdown of real processes under load."""

import threading
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import running_system

IMAGE = np.zeros((1, 8, 8), np.uint8)
LAYERS = ("gateway", "preprocess", "inference", "postprocess")


def infer_digits(address: str, metadata: tuple = ()) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(codec.build_request("digits", {"images": IMAGE}), metadata=metadata)


def test_every_process_exits_cleanly_on_sigterm_while_busy(tmp_path: Path) -> None:
    errors: list[grpc.StatusCode] = []
    with running_system(tmp_path) as system:
        address = system.address("gateway")
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    infer_digits(address)
                except grpc.RpcError as exc:
                    errors.append(exc.code())

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest()).status
        codes = system.stop_all()
        stop.set()
        for worker in workers:
            worker.join()
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert codes == dict.fromkeys(system.instances, 0)
    # Once the gateway stops, new calls are refused; nothing in flight fails otherwise.
    assert set(errors) <= {grpc.StatusCode.UNAVAILABLE}
