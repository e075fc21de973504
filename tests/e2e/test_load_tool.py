"""The load tool against real servers: ghz's report, counts that add up, no coordinated omission."""

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from scripts.make_certs import make_certs
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support import load_cli
from tests.support.system import free_port

CALL = ("--insecure", "--call", "inference.GRPCInferenceService.ModelInfer")
TABULAR = json.dumps(
    {
        "model_name": "tabular",
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 30],
                "contents": {"fp32_contents": [1.0] * 30},
            },
        ],
    }
)
SLEEP = 0.05  # seconds the slow server takes per request, one request at a time


def load(*args: str, timeout: float = 60, call: tuple = CALL) -> subprocess.CompletedProcess:
    return load_cli.run(call, *args, timeout=timeout)


def report(*args: str) -> dict:
    return load_cli.json_report(CALL, *args)


def check_ghz_shape(got: dict) -> None:
    """ghz's fields, with ghz's types, and counts that add up."""
    for key in ("count", "total", "average", "fastest", "slowest"):
        assert isinstance(got[key], int), key
    assert isinstance(got["rps"], float)
    assert isinstance(got["date"], str) and got["endReason"] in ("normal", "timeout")
    assert isinstance(got["errorDistribution"], dict)
    assert sum(got["statusCodeDistribution"].values()) == got["count"]
    answered = got["statusCodeDistribution"].get("OK", 0)
    assert answered > 0
    assert sum(b["count"] for b in got["histogram"]) == answered
    assert all(isinstance(b["mark"], float) for b in got["histogram"])
    points = got["latencyDistribution"]
    assert [p["percentage"] for p in points] == [10, 25, 50, 75, 90, 95, 99]
    latencies = [p["latency"] for p in points]
    assert all(isinstance(v, int) for v in latencies) and latencies == sorted(latencies)
    assert got["fastest"] <= latencies[0] <= latencies[-1] <= got["slowest"]
    assert len(got["details"]) == got["count"]


def test_open_loop_through_the_gateway_reports_like_ghz(gateway: str) -> None:
    got = report("--dataset", "digits", "--rps", "40", "-z", "1500ms", gateway)
    check_ghz_shape(got)
    assert got["count"] == 60  # 40 a second for 1.5 s, every one waited for
    assert got["endReason"] == "timeout"  # ghz's word for a run that lasted -z
    assert got["strata"]["loop"] == "open" and got["options"]["rps"] == 40.0
    assert got["options"]["call"] == "inference.GRPCInferenceService.ModelInfer"


def test_closed_loop_with_json_data_and_metadata_from_two_workers(gateway: str) -> None:
    got = report(
        "-d",
        TABULAR,
        "-n",
        "30",
        "-c",
        "3",
        "--workers",
        "2",
        "-m",
        '{"x-client-id": "load-test"}',
        gateway,
    )
    check_ghz_shape(got)
    assert got["count"] == 30 and got["endReason"] == "normal"
    assert got["statusCodeDistribution"] == {"OK": 30}
    assert got["strata"]["client"]["workers"] == 2
    assert (got["options"]["total"], got["options"]["concurrency"]) == (30, 3)


def test_the_summary_is_for_people(gateway: str) -> None:
    done = load("-d", TABULAR, "-n", "10", "-c", "2", gateway)
    assert done.returncode == 0, done.stderr
    for section in ("Summary:", "Requests/sec:", "Latency distribution:", "[OK]", "Load tool:"):
        assert section in done.stdout


class SlowServer(v2_grpc.GRPCInferenceServiceServicer):
    """Answers one request at a time, in arrival order, each after SLEEP seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def ModelInfer(self, request, context) -> v2.ModelInferResponse:
        with self._lock:
            time.sleep(SLEEP)
        return v2.ModelInferResponse(model_name=request.model_name)


@pytest.fixture
def slow_server() -> Iterator[str]:
    yield from load_cli.serve(SlowServer(), workers=1)


@pytest.mark.parametrize("cap", [[], ["-c", "1"]], ids=["unbounded", "one-in-flight"])
def test_open_loop_latency_counts_the_queue_at_a_stalled_server(
    slow_server: str, cap: list[str]
) -> None:
    # 40 requests a second at a server that answers 20: request i is due at i/40 s but
    # cannot be answered before (i + 1) * 50 ms, so it waits at least 50 ms + i * 25 ms.
    # With one request in flight the client itself sends late; timed from when each was
    # sent (coordinated omission), every request would look like 50 ms.
    got = report(
        "-d", '{"model_name": "slow"}', "--rps", "40", "-n", "60", "-t", "30s", *cap, slow_server
    )
    assert got["statusCodeDistribution"] == {"OK": 60}
    median = next(p["latency"] for p in got["latencyDistribution"] if p["percentage"] == 50)
    assert median >= 10 * SLEEP * 1e9  # at least 0.5 s; a queue-blind tool says 0.05 s
    assert got["slowest"] >= 24 * SLEEP * 1e9  # the last one waited at least 1.5 s


def test_an_unreachable_target_fails_with_a_clear_message() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = load("-d", TABULAR, "-n", "5", "--connect-timeout", "1s", address, timeout=30)
    assert done.returncode == 1
    assert f"cannot connect to {address}" in done.stderr
    assert done.stdout == ""


class Echo(v2_grpc.GRPCInferenceServiceServicer):
    def ModelInfer(self, request, context):
        return v2.ModelInferResponse(model_name=request.model_name)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder)
    return folder


@pytest.fixture
def mutual_tls_server(certs: Path) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), server)
    identity = (
        (certs / "inference" / "tls.key").read_bytes(),
        (certs / "inference" / "tls.crt").read_bytes(),
    )
    credentials = grpc.ssl_server_credentials(
        [identity],
        root_certificates=(certs / "inference" / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_mutual_tls_with_ghz_flags_and_skip_first(mutual_tls_server: str, certs: Path) -> None:
    call = ("--call", "inference.GRPCInferenceService.ModelInfer")
    tls = ["--cacert", str(certs / "gateway" / "ca.crt")]
    identity = [
        "--cert",
        str(certs / "gateway" / "tls.crt"),
        "--key",
        str(certs / "gateway" / "tls.key"),
    ]
    common = ["-d", '{"model_name": "echo"}', "-n", "20", "-c", "2", "-O", "json"]
    done = load(*common, *tls, *identity, "--skipFirst", "5", mutual_tls_server, call=call)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["statusCodeDistribution"] == {"OK": 15}, "the first 5 answers are left out"
    assert got["options"]["insecure"] is False and got["options"]["skipFirst"] == 5
    refused = load(*common, *tls, "--connect-timeout", "1s", mutual_tls_server, call=call)
    assert refused.returncode == 1 and "cannot connect" in refused.stderr, "no client cert"
    mixed = load(*common, *tls, "--insecure", mutual_tls_server, call=call)
    assert mixed.returncode == 2 and "contradicts" in mixed.stderr
