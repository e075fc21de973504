"""Preprocess replicas: the gateway spreads calls over them and survives losing one."""

import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from strata import codec
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.system import endpoint, running_system

IMAGE = np.zeros((1, 8, 8), np.uint8)


def test_killing_one_of_two_preprocess_replicas_fails_no_request(tmp_path: Path) -> None:
    changes = {"services": {"preprocess": endpoint(replicas=2)}}
    with running_system(tmp_path, changes) as system:
        assert {"preprocess-0", "preprocess-1"} <= set(system.instances)
        stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        outcomes: list[str] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    stub.ModelInfer(codec.build_request("digits", {"images": IMAGE}), timeout=10)
                    outcomes.append("OK")
                except grpc.RpcError as exc:
                    outcomes.append(f"{exc.code().name}: {exc.details()}")

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        time.sleep(1.0)
        before = len(outcomes)
        system.stop("preprocess-0", signal.SIGKILL)
        time.sleep(2.0)
        stop.set()
        for worker in workers:
            worker.join()
    failures = [o for o in outcomes if o != "OK"]
    assert failures == []
    assert len(outcomes) - before > 20, "load kept flowing after the kill"
