"""Trace context across every hop, health, and clean shutdown of real processes."""

import secrets
import threading
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata import codec
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.traces import Receiver
from tests.support.system import running_system

IMAGE = np.zeros((1, 8, 8), np.uint8)
LAYERS = ("gateway", "preprocess", "inference", "postprocess")


def infer_digits(address: str, metadata: tuple = ()) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(codec.build_request("digits", {"images": IMAGE}), metadata=metadata)


def test_trace_context_follows_the_request_through_every_hop(tmp_path: Path) -> None:
    trace_id = secrets.token_hex(16)
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    with Receiver() as collector:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with running_system(tmp_path, env=env) as system:
            infer_digits(system.address("gateway"), (("traceparent", traceparent),))
            services = {f"strata-{name}" for name in LAYERS}
            spans = collector.wait_for(trace_id, services)
    assert {s.service for s in spans} == services
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_id not in ids]
    assert len(roots) == 1 and roots[0].service == "strata-gateway"


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
