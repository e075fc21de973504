"""The servers the peer benchmark drives, each started on free loopback ports and stopped after.

Every one serves the same ONNX file (the digits model version the pipeline's first arm routes
to). Starting one yields its `Target`s: where to send, what to send, and which processes are
the server (for their CPU time). Strata's gateway and MLServer also yield a REST target beside
the gRPC one: the same server and requests, as v2 JSON bodies posted over HTTP/1.1. A peer that
cannot be installed or started raises `Unavailable` with the reason, and the benchmark reports
it as skipped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.admin import Admin
from bench.deployment import free_port, running, service_pids
from bench.load import rest
from bench.load.worker import INFER
from bench.peers import venvs
from bench.workloads import Workload
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
START_SECONDS = 120.0
REST_READY_SECONDS = 20.0  # after the server's gRPC side is ready, its REST side is too
STOP_SECONDS = 10.0
IMAGES = "`images` UINT8 [1, 8, 8]"
PIXELS = "`pixels` FP32 [1, 64]"
AS_JSON = ", as JSON"


class Unavailable(RuntimeError):
    """This server cannot be measured here; the message says why."""


@dataclass(frozen=True)
class Target:
    """One server to measure: its address, its requests and its processes."""

    server: str  # the row's key: pipeline, pipeline-rest, inference, mlserver ...
    title: str
    address: str  # gRPC: host:port; REST: http://host:port
    requests: tuple[bytes, ...]  # serialized v2 messages; REST: v2 JSON bodies
    carries: str  # what one request holds
    roots: Callable[[], dict[str, int]]  # the server's processes by name (descendants count too)
    method: str = INFER  # REST: /v2/models/NAME/infer

    @property
    def http(self) -> bool:
        return rest.is_url(self.address)

    def connections(self, concurrency: int, grpc: int = 1) -> int:
        """HTTP/1.1 carries one request at a time on a connection: one for each in flight.
        gRPC: `grpc`, the calls shared among them as HTTP/2 streams (one, as tritonclient
        keeps, unless asked)."""
        return concurrency if self.http else grpc


@dataclass(frozen=True)
class Context:
    """What every server needs to start: the config, the workload, a scratch folder."""

    config: Path
    workload: Workload
    folder: Path

    @property
    def model_file(self) -> Path:
        return self.workload.folder / "model.onnx"


# The groups of targets, in the order they run, and the servers each group yields.
GROUPS = {
    "strata": ("pipeline", "pipeline-rest", "inference"),
    "mlserver": ("mlserver", "mlserver-rest"),
    "kserve": ("kserve",),
    "bare": ("bare",),
}
SERVERS = tuple(server for servers in GROUPS.values() for server in servers)


def start(group: str, ctx: Context) -> Iterator[list[Target]]:
    """The context manager that runs `group`'s servers."""
    return {"bare": bare, "strata": strata, "mlserver": mlserver, "kserve": kserve}[group](ctx)


@contextmanager
def strata(ctx: Context) -> Iterator[list[Target]]:
    """The whole system from the config, the ladder pinned at level 0 (the full pipeline), its
    gateway serving REST beside gRPC."""
    w = ctx.workload
    folder = ctx.folder / "strata"
    folder.mkdir()
    with running(ctx.config, folder) as (supervisor, token):
        rest_address = supervisor.settings.services.gateway.rest
        admin = Admin(supervisor.address("gateway"), token)
        try:
            admin.force(0)
        finally:
            admin.close()
        deployment = f"inference-{w.deployment}"
        pids = functools.partial(service_pids, supervisor)
        yield [
            Target(
                "pipeline",
                "Strata pipeline (gateway)",
                supervisor.address("gateway"),
                w.pipeline_requests,
                IMAGES,
                pids,
            ),
            Target(
                "pipeline-rest",
                "Strata pipeline (gateway REST)",
                f"http://{rest_address}",
                _bodies(w.pipeline_requests),
                IMAGES + AS_JSON,
                pids,
                rest.infer_path(w.pipeline),
            ),
            Target(
                "inference",
                f"Strata inference alone ({deployment})",
                supervisor.address(deployment),
                w.model_requests,
                PIXELS,
                lambda: {deployment: supervisor.processes[deployment].pid},
            ),
        ]


@contextmanager
def bare(ctx: Context) -> Iterator[list[Target]]:
    """bench/bare.py in the project's venv: one process, no batching."""
    address = loopback_address()
    command = [sys.executable, "-m", "bench.bare", "--model", str(ctx.model_file)]
    command += ["--name", ctx.workload.model, "--listen", address]
    with server_process(command, ctx.folder / "bare.log") as process:
        await_ready(address, ctx.workload.model, process, ctx.folder / "bare.log")
        requests, roots = model_requests(ctx.workload), {"bare": process.pid}
        title = "bare grpc.aio + ONNX Runtime"
        yield [Target("bare", title, address, requests, PIXELS, roots.copy)]


@contextmanager
def mlserver(ctx: Context) -> Iterator[list[Target]]:
    """MLServer with the custom ONNX runtime and adaptive batching (32 rows, 5 ms)."""
    python = installed(venvs.MLSERVER)
    address, http, folder = loopback_address(), loopback_address(), ctx.folder / "mlserver"
    _mlserver_settings(folder, ctx, port_of(address), port_of(http))
    log = ctx.folder / "mlserver.log"
    env = {"PYTHONPATH": str(HERE)}
    command = [str(python.parent / "mlserver"), "start", str(folder)]  # its console script
    with server_process(command, log, env) as process:
        await_ready(address, ctx.workload.model, process, log)
        batching = "(adaptive batching 32 / 5 ms)"
        roots = {"mlserver": process.pid}
        requests = model_requests(ctx.workload)
        yield [
            Target("mlserver", f"MLServer 1.7.1 {batching}", address, requests, PIXELS, roots.copy),
            Target(
                "mlserver-rest",
                f"MLServer 1.7.1 REST {batching}",
                f"http://{http}",
                _bodies(requests),
                PIXELS + AS_JSON,
                roots.copy,
                rest.infer_path(ctx.workload.model),
            ),
        ]


def _mlserver_settings(folder: Path, ctx: Context, grpc_port: int, http_port: int) -> None:
    model = folder / ctx.workload.model
    model.mkdir(parents=True)
    server = {
        "debug": False,
        "host": "127.0.0.1",
        "grpc_port": grpc_port,
        "http_port": http_port,
        "metrics_port": free_port(),
        "model_repository_root": str(folder),
        "load_models_at_startup": True,
    }
    settings = {
        "name": ctx.workload.model,
        "implementation": "mlserver_onnx.OnnxModel",
        "max_batch_size": 32,
        "max_batch_time": 0.005,
        "parameters": {"uri": str(ctx.model_file)},
    }
    (folder / "settings.json").write_text(json.dumps(server, indent=2))
    (model / "model-settings.json").write_text(json.dumps(settings, indent=2))


@contextmanager
def kserve(ctx: Context) -> Iterator[list[Target]]:
    """KServe's model server as a transformer in front of a predictor, over v2 gRPC."""
    python = installed(venvs.KSERVE)
    script = [str(python), str(HERE / "kserve_digits.py")]
    predictor, front = loopback_address(), loopback_address()
    env = {"KSERVE_LOGLEVEL": "WARNING"}  # no log line per request, as Strata's WARNING
    with ExitStack() as stack:
        processes = {}
        for role, address, extra in (
            ("predictor", predictor, ["--model_path", str(ctx.model_file)]),
            ("transformer", front, ["--predictor_host", predictor]),
        ):
            command = [*script, role, *extra, *kserve_flags(address)]
            log = ctx.folder / f"kserve-{role}.log"
            processes[role] = stack.enter_context(server_process(command, log, env))
            await_ready(address, "digits", processes[role], log)
        roots = {role: p.pid for role, p in processes.items()}
        title = "KServe 0.21.0 (transformer + predictor)"
        requests = pipeline_requests(ctx.workload)
        yield [Target("kserve", title, front, requests, IMAGES, roots.copy)]


def kserve_flags(address: str) -> list[str]:
    return [
        *("--grpc_port", str(port_of(address)), "--http_port", str(free_port())),
        *("--predictor_protocol", "grpc-v2", "--enable_latency_logging", "False"),
    ]


def model_requests(w: Workload) -> tuple[bytes, ...]:
    """The inference-alone requests without a model version (a peer serves one)."""
    return _rewrite(w.model_requests, lambda r: r.ClearField("model_version"))


def pipeline_requests(w: Workload) -> tuple[bytes, ...]:
    """The pipeline's requests without Strata's A/B parameter."""
    return _rewrite(w.pipeline_requests, lambda r: r.ClearField("parameters"))


def _bodies(requests: Sequence[bytes]) -> tuple[bytes, ...]:
    """The same requests as v2 REST JSON bodies."""
    return tuple(rest.json_body(raw) for raw in requests)


def _rewrite(
    requests: Sequence[bytes], change: Callable[[v2.ModelInferRequest], None]
) -> tuple[bytes, ...]:
    out = []
    for raw in requests:
        request = v2.ModelInferRequest.FromString(raw)
        change(request)
        out.append(request.SerializeToString())
    return tuple(out)


def installed(env: venvs.Environment) -> Path:
    try:
        return venvs.ensure(env)
    except venvs.InstallFailed as exc:
        raise Unavailable(str(exc)) from exc


def loopback_address() -> str:
    return f"127.0.0.1:{free_port()}"


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@contextmanager
def server_process(
    command: list[str], log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """`command` in a session of its own (so its workers stop with it), output to `log`."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process's own group, SIGKILL if it overstays."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):  # the group has already gone
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=STOP_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue


def await_ready(address: str, model: str, process: subprocess.Popen, log: Path) -> None:
    """Until the server says `model` is ready; Unavailable if it exits or takes too long."""
    end = time.monotonic() + START_SECONDS
    with grpc.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < end:
            if process.poll() is not None:
                raise Unavailable(f"exited with {process.returncode} on start ({_tail(log)})")
            try:
                if stub.ModelReady(v2.ModelReadyRequest(name=model), timeout=1).ready:
                    return
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.2)
    raise Unavailable(f"not ready within {START_SECONDS:g} s (log {log})")


def await_rest(target: Target) -> None:
    """Until a REST target's `GET /v2/models/NAME/ready` answers 200; Unavailable if it does
    not within REST_READY_SECONDS (a gRPC target is ready when it is yielded)."""
    if not target.http:
        return
    url = target.address + rest.ready_path(target.method)
    end = time.monotonic() + REST_READY_SECONDS
    why = "no answer"
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return  # urlopen raises for any status but 2xx
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
        except OSError as exc:  # not listening (URLError is an OSError)
            why = str(getattr(exc, "reason", exc))
        time.sleep(0.2)
    raise Unavailable(f"GET {url} not ready within {REST_READY_SECONDS:g} s ({why})")


def _tail(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return (lines or ["no output"])[-1][-300:] + f"; log {log}"
