"""Flights cut into parts for two real preprocess replicas (gateway.split_flight_bytes,
gateway.replica_messages): concurrent requests travel in flights, each flight's call to
preprocess goes as parts that both replicas take, and every answer is the one the request
gets alone (the parts' results stacked back in member order)."""

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import free_port, running_system

REQUESTS = 48
IN_FLIGHT = 16
CLIENT = (("x-client-id", "parts"),)  # one client: one arm, so its requests share flights


def metrics_address(count: int = 1) -> str:
    return f"127.0.0.1:{free_port(count)}"


def samples(address: str, family: str) -> list:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as page:
        text = page.read().decode()
    return next(f.samples for f in text_string_to_metric_families(text) if f.name == family)


def messages(address: str) -> float:
    """Preprocess calls a replica served, as messages on lanes or unary."""
    return sum(
        s.value
        for s in samples(address, "strata_rpc_server_requests")
        if s.name == "strata_rpc_server_requests_total"
        and s.labels["method"]
        in ("/strata.v1.Preprocess/Process", "/strata.v1.Preprocess/ProcessStream")
    )


def flights(address: str) -> float:
    """Flights the gateway sent (the flight-size histogram's count)."""
    return sum(
        s.value
        for s in samples(address, "strata_gateway_flight_requests")
        if s.name == "strata_gateway_flight_requests_count"
    )


def test_concurrent_flights_are_cut_into_parts_both_replicas_take(tmp_path: Path) -> None:
    changes = {
        "gateway": {"split_flight_bytes": 4096},  # a request's 4 rows of 32x32: a part each
        # Not a test of the door: on a loaded machine 16 calls at once may wait past half of
        # the default 250 ms before it, which refuses them (seen in a make test run).
        "pipelines": {"digits": {"latency_objective_ms": 10000}},
        "services": {
            "gateway": {"metrics": metrics_address()},
            "preprocess": {"metrics": metrics_address(2)},
        },
    }
    rng = np.random.default_rng(46)
    images = [rng.integers(0, 256, (4, 32, 32), dtype=np.uint8) for _ in range(REQUESTS)]
    requests = [codec.build_request("digits", {"images": image}) for image in images]
    with running_system(tmp_path, changes) as system:
        channel = grpc.insecure_channel(system.address("gateway"))
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        alone = [stub.ModelInfer(r, metadata=CLIENT, timeout=30) for r in requests]
        services = system.settings.services
        replicas = [
            services.preprocess.metrics_for(listen) for listen in services.preprocess.listens
        ]
        before = [messages(address) for address in replicas], flights(services.gateway.metrics)
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            together = list(
                pool.map(lambda r: stub.ModelInfer(r, metadata=CLIENT, timeout=60), requests)
            )
        served = [messages(a) - b for a, b in zip(replicas, before[0], strict=True)]
        flown = flights(services.gateway.metrics) - before[1]
        channel.close()
    for one, many in zip(alone, together, strict=True):
        expected, got = codec.response_outputs(one), codec.response_outputs(many)
        assert list(got["labels"].ravel()) == list(expected["labels"].ravel())
        np.testing.assert_allclose(got["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
    print("messages by replica", served, "flights", flown)
    assert flown < REQUESTS  # requests shared flights
    assert sum(served) > flown  # and flights went as parts
    assert min(served) > 0
