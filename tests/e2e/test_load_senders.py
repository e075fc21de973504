"""The load tool's two senders, Python and compiled (bench/load/native.py), against the same
real gRPC server: the same counts, codes, error messages and flags, and the same way to stop."""

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from bench.load import native
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support import load_cli
from tests.support.system import ROOT, free_port

CALL = ("--call", "inference.GRPCInferenceService.ModelInfer")
# One message of each kind, sent in turn: the server answers each by its id.
MESSAGES = json.dumps(
    [{"model_name": "m", "id": kind} for kind in ("plain", "degraded", "cached", "busy")]
)
SENDERS = ["python", "compiled"]


@pytest.fixture(scope="module")
def compiled_built() -> None:
    """build/load-sender, built here from source where gRPC's C++ library is installed."""
    if not native.BINARY.is_file():
        if (
            shutil.which("pkg-config") is None
            or subprocess.run(["pkg-config", "--exists", "grpc++"], check=False).returncode
        ):
            pytest.skip("the compiled sender needs libgrpc++-dev (apt-get install libgrpc++-dev)")
        subprocess.run(["make", "-s", "load-sender"], cwd=ROOT, check=True, timeout=300)


@pytest.fixture(params=SENDERS)
def sender(request: pytest.FixtureRequest) -> str:
    if request.param == "compiled":
        request.getfixturevalue("compiled_built")
    return request.param


class Kinds(v2_grpc.GRPCInferenceServiceServicer):
    """A full answer, a degraded one, a cached one, or RESOURCE_EXHAUSTED, as the id asks;
    `hold` seconds each."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.called = threading.Event()  # set by the first call

    def ModelInfer(self, request, context) -> v2.ModelInferResponse:
        self.called.set()
        time.sleep(self.hold)
        if request.id == "busy":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy, retry in 0.100s")
        reply = v2.ModelInferResponse(model_name=request.model_name, id=request.id)
        reply.parameters["strata.level"].int64_param = 1
        reply.parameters["strata.degraded"].bool_param = request.id == "degraded"
        if request.id == "cached":
            reply.parameters["strata.cached"].bool_param = True
        return reply


@pytest.fixture
def kinds() -> Iterator[str]:
    yield from load_cli.serve(Kinds())


@pytest.fixture
def watched_kinds() -> Iterator[tuple[str, Kinds]]:
    """`kinds`, with its servicer: whether the tool has begun sending."""
    servicer = Kinds()
    for address in load_cli.serve(servicer):
        yield address, servicer


@pytest.fixture
def slow_kinds() -> Iterator[str]:
    yield from load_cli.serve(Kinds(hold=0.2))


def load(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return load_cli.run(CALL, *args, timeout=timeout)


def report(*args: str) -> dict:
    return load_cli.json_report(CALL, *args)


@pytest.mark.parametrize(
    "loop", [["-n", "40", "-c", "4"], ["--rps", "200", "-n", "40"]], ids=["closed", "open"]
)
def test_codes_errors_and_flags(kinds: str, sender: str, loop: list[str]) -> None:
    got = report("-d", MESSAGES, *loop, "--connections", "2", "--sender", sender, kinds)
    assert got["strata"]["sender"] == sender
    assert got["count"] == 40 and len(got["details"]) == 40
    assert got["statusCodeDistribution"] == {"OK": 30, "ResourceExhausted": 10}
    assert got["errorDistribution"] == {
        "rpc error: code = ResourceExhausted desc = busy, retry in 0.100s": 10
    }
    assert (got["strata"]["degraded"], got["strata"]["cached"]) == (10, 10)


def test_both_senders_word_a_missed_deadline_alike(slow_kinds: str, compiled_built: None) -> None:
    words = []
    for sender in SENDERS:
        got = report(
            "-d", MESSAGES, "-n", "4", "-c", "4", "-t", "50ms", "--sender", sender, slow_kinds
        )
        assert got["statusCodeDistribution"] == {"DeadlineExceeded": 4}
        words.append(got["errorDistribution"])
    assert words[0] == words[1]


def test_the_compiled_sender_says_it_cannot_reach_a_target(compiled_built: None) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = load(
        "-d", MESSAGES, "-n", "5", "--connect-timeout", "1s", "--sender", "compiled", address
    )
    assert done.returncode == 1
    assert f"cannot connect to {address} within 1s (connection refused" in done.stderr


def test_the_compiled_sender_refuses_what_it_cannot_send() -> None:
    url = "http://127.0.0.1:1/v2/models/m/infer"
    done = subprocess.run(
        [sys.executable, "-m", "bench.load", "-d", "{}", "-n", "1", "--sender", "compiled", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "the compiled sender cannot send this run" in done.stderr and "HTTP" in done.stderr


# As from a terminal: a suite started in the background (`.ci/run &`) hands its children SIGINT
# ignored, and a Python started so keeps ignoring it. So the tool runs through a Python that
# restores it, then replaces itself with the tool. Not a preexec_fn: that runs Python in the
# forked child of this multi-threaded process (gRPC's threads), and in a fresh clone's run the
# child once hung there, before it ran the tool ("the tool sent nothing within 60 s").
SIGINT_AS_FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_ctrl_c_stops_sending_and_reports_what_was_sent(
    watched_kinds: tuple[str, Kinds], sender: str
) -> None:
    kinds, servicer = watched_kinds
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SIGINT_AS_FROM_A_TERMINAL,
            "-m",
            "bench.load",
            *CALL,
            "-d",
            MESSAGES,
            "--rps",
            "100",
            "-z",
            "60s",
            "--sender",
            sender,
            "-O",
            "json",
            kinds,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Once the workers send (a fresh clone's first start compiles every module: seconds
        # under a loaded suite), and a while more; a Ctrl-C before the run is not this test's.
        assert servicer.called.wait(60), "the tool sent nothing within 60 s"
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    got = json.loads(out)
    assert got["endReason"] == "cancel"
    assert 0 < got["count"] < 6000 and got["strata"]["sender"] == sender
