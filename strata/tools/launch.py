"""Run the whole system on one machine: `python -m strata.tools.launch --config FILE` (`make run`).

Starts each layer as its own process, waits until each one's health service says SERVING
for this launcher's id (strata.process.launched: its own child, not another process on the
same port), and stays in the foreground. While they start, the first instance to exit (or a
timeout) stops them all, and the launcher exits with that instance's code: a deployment comes
up whole or not at all. Once up, an instance that exits on its own is restarted after a
backoff that doubles while it keeps failing (as a Kubernetes Deployment would), and the
others keep serving meanwhile: a dead replica costs the requests it held, not the system.
An instance that exits with a code no restart can change (strata.process.exits: its config, a
model, a certificate, an address in use) is said once and left down; the rest keep serving,
and once none is left the launcher stops with that code.
Ctrl-C or SIGTERM stops every service (front to back), each draining within its grace period.
Services run as forks of one zygote that has imported what they share (strata.process.zygote),
or, with STRATA_FORK=0 or no fork, as `python -m services.<layer>`; nothing here imports them.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc

import strata.process.pydantic_plugins  # noqa: F401  (first: before any pydantic model is built)
from strata.config import ConfigError, Settings, load_settings
from strata.config.pipelines import TensorSpec
from strata.config.preprocess import DecodeStep
from strata.config.tls import TlsSettings
from strata.process.exits import PERMANENT, AddressUnusable, ConfigInvalid, one_line
from strata.process.forked import Child, Start, Zygote, ZygoteRefused, enabled
from strata.process.launched import LAUNCH_ID, launch_service

log = logging.getLogger("strata.tools.launch")
ROOT = Path(__file__).resolve().parents[2]


def serving(address: str, tls: TlsSettings, service: str = "") -> bool:
    """Whether the gRPC health service at `address` answers SERVING now (for `service`)."""
    # Here, not at the top: the serving stack it imports (some 80 ms) then loads while the
    # children start, instead of before the launcher can start them.
    from strata.tools.healthcheck import check

    try:
        return check(address, service, timeout=1.0, tls=tls) == "SERVING"
    except grpc.RpcError:
        return False


def wait_serving(address: str, timeout: float, tls: TlsSettings) -> bool:
    """Poll the gRPC health service at `address` until it answers SERVING."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if serving(address, tls):
            return True
        time.sleep(0.1)
    return False


START_ATTEMPTS = 3  # starts on fresh ports after an address was taken (start_on_fresh_ports)


class StartFailed(RuntimeError):
    """An instance exited, or never became SERVING, while the deployment started."""

    def __init__(self, name: str, code: int | None, config: Path) -> None:
        self.name, self.code = name, code
        state = "never became SERVING" if code is None else exit_reason(code)
        super().__init__(f"{name} {state} while starting (config {config})")


def start_on_fresh_ports(build: Callable[[], Supervisor], timeout: float = 60.0) -> Supervisor:
    """A started supervisor from `build`, built again when an instance exits because an
    address it must bind was taken: a caller that picks free ports and starts services on
    them (tests, benchmarks) can lose one to another process in between. Any other failure,
    or the third such one, is raised. A lost attempt's logs are set aside (`attempt-N/` in
    the log folder), so the folder's logs are those of the processes that serve: what each
    process says once at start is there once."""
    attempt = 1
    while True:
        supervisor = build()
        try:
            supervisor.start_all(timeout=timeout)
            return supervisor
        except StartFailed as exc:
            supervisor.stop_all()
            if exc.code != AddressUnusable.code or attempt == START_ATTEMPTS:
                raise
            supervisor.set_logs_aside(f"attempt-{attempt}")
        attempt += 1


@dataclass(frozen=True)
class Backoff:
    """How long the launcher waits before restarting an instance that exited on its own."""

    first: float = 0.5
    longest: float = 30.0
    # An instance that ran this long before it exited starts again from `first`.
    healthy_after: float = 60.0

    def after(self, previous: float, ran: float) -> float:
        if ran >= self.healthy_after or previous <= 0:
            return self.first
        return min(self.longest, previous * 2)


@dataclass(frozen=True)
class Instance:
    """One process: e.g. `preprocess-1` of service `preprocess` on its own port."""

    name: str
    service: str
    listen: str


def instances(settings: Settings) -> list[Instance]:
    """Every process the deployment runs locally, back to front."""
    services = settings.services
    out = [
        instance
        for name, endpoint in services.inference.items()
        for instance in _replicas(f"inference-{name}", "inference", endpoint.listens)
    ]
    for service in ("postprocess", "preprocess"):
        out += _replicas(service, service, getattr(services, service).listens)
    return [*out, Instance("gateway", "gateway", services.gateway.listen)]


def _replicas(name: str, service: str, listens: list[str]) -> list[Instance]:
    """One instance per listen address: `name`, or `name-0`, `name-1`... for several."""
    return [
        Instance(name if len(listens) == 1 else f"{name}-{i}", service, listen)
        for i, listen in enumerate(listens)
    ]


class Supervisor:
    """Starts, watches and stops the service processes of one deployment."""

    def __init__(
        self,
        config: Path,
        settings: Settings,
        log_dir: Path | None = None,
        env: dict[str, str] | None = None,
        backoff: Backoff = Backoff(),
    ) -> None:
        self.config = config
        self.settings = settings
        self.log_dir = log_dir
        self.env = env
        self.backoff = backoff
        self.instances = {i.name: i for i in instances(settings)}
        self.processes: dict[str, Child] = {}
        self._forks: Zygote | None = None
        self._fork_refusal: str | None = None
        self.restarts: dict[str, int] = {}
        # Instances that exited for a reason no restart fixes, with their exit codes.
        self.left_down: dict[str, int] = {}
        self._started: dict[str, float] = {}
        self._delay: dict[str, float] = {}
        self._due: dict[str, float] = {}
        # Told to each child, which reports it on its health service: SERVING from another
        # process on the same port (another deployment's) is not this deployment up.
        self.launch_id = secrets.token_hex(8)

    def address(self, name: str) -> str:
        return self.instances[name].listen

    def spawn(self, name: str) -> Child:
        """Start one instance's process without waiting for it: a fork of this deployment's
        zygote (strata.process.zygote), or its own interpreter where there is none."""
        instance = self.instances[name]
        common = {**os.environ, **(self.env or {})}
        start = Start(
            name,
            f"services.{instance.service}",
            ["--config", str(self.config), "--listen", instance.listen],
            {**common, LAUNCH_ID: self.launch_id},
            None if self.log_dir is None else self.log_dir / f"{name}.log",
        )
        process = self._forked(start, self._zygote(common)) or _executed(start)
        self.processes[name] = process
        self._started[name] = time.monotonic()
        return process

    def _zygote(self, env: dict[str, str]) -> Zygote | None:
        """The zygote that forks instances started with `env`, started on first use; None
        where forking is off, the zygote refused, or `env` is not the one it started with
        (what an interpreter reads as it starts cannot change after a fork)."""
        if self._forks is not None and self._forks.gone:
            self._close_zygote()
        if self._forks is None and self._fork_refusal is None and enabled(env):
            try:
                self._forks = Zygote(env, ROOT)
            except ZygoteRefused as exc:
                self._refused(exc)
        if self._forks is None or self._forks.env != env:
            return None
        return self._forks

    def _forked(self, start: Start, zygote: Zygote | None) -> Child | None:
        """`start` forked by `zygote`; None where there is none or it stopped answering."""
        if zygote is None:
            return None
        try:
            return zygote.fork(start)
        except ZygoteRefused as exc:
            self._refused(exc)
            return None

    def _refused(self, exc: ZygoteRefused) -> None:
        self._fork_refusal = str(exc)
        self._close_zygote()
        log.warning("services start without a zygote: %s", exc)

    def _close_zygote(self) -> None:
        if self._forks is not None:
            self._forks.close()
            self._forks = None

    def await_serving(self, *names: str, timeout: float = 60.0) -> None:
        """Wait until each of `names` is SERVING, as this launcher's own child (not another
        process on its port). The moment any instance exits, or when `timeout` runs out,
        stop everything and raise StartFailed."""
        end = time.monotonic() + timeout
        waiting = list(names)
        mine = launch_service(self.launch_id)
        while waiting:
            exited = self.failed()  # every instance's, each time: a poll costs nothing
            if exited is not None:
                self._abort(exited, self.processes[exited].returncode)
            if serving(self.address(waiting[0]), self.settings.tls, mine):  # one health call
                waiting.pop(0)
                continue
            if time.monotonic() > end:
                self._abort(waiting[0], None)
            time.sleep(0.1)

    def _abort(self, name: str, code: int | None) -> NoReturn:
        self.stop_all()
        raise StartFailed(name, code, self.config)

    def start(self, name: str, timeout: float = 60.0) -> Child:
        """Start one instance and wait until it is SERVING."""
        process = self.spawn(name)
        self.await_serving(name, timeout=timeout)
        return process

    def start_all(self, timeout: float = 60.0) -> None:
        """Start every instance at once (start-up is mostly imports), then wait for all."""
        for name in self.instances:
            self.spawn(name)
        self.await_serving(*self.instances, timeout=timeout)

    def set_logs_aside(self, folder: str) -> None:
        """Move each instance's log into `folder` under the log folder, where a log folder
        is set: a deployment started after this one then writes logs of its own there, not
        after these (spawn appends, for a restarted instance)."""
        if self.log_dir is None:
            return
        aside = self.log_dir / folder
        aside.mkdir(exist_ok=True)
        for name in self.instances:
            log_file = self.log_dir / f"{name}.log"
            if log_file.exists():
                log_file.rename(aside / log_file.name)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> int:
        """Signal one instance (SIGTERM drains) and wait; kill it if it overstays."""
        process = self.processes.pop(name)
        if process.poll() is None:
            process.send_signal(sig)
        try:
            return process.wait(timeout=self.settings.server.grace_seconds + 10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return -signal.SIGKILL

    def stop_all(self) -> dict[str, int]:
        """Stop front to back, so no layer loses its upstream while it still drains."""
        self._due.clear()
        running = [name for name in reversed(self.instances) if name in self.processes]
        codes = {name: self.stop(name) for name in running}
        self._close_zygote()
        return codes

    def failed(self) -> str | None:
        """The name of an instance that has exited on its own, if any."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                return name
        return None

    def tend(self) -> None:
        """Schedule a restart for each instance that exited on its own, or leave it down
        when a restart cannot help; start those due."""
        now = time.monotonic()
        for name, process in list(self.processes.items()):
            code = process.poll()
            if code is None or name in self._due:
                continue
            ran = now - self._started[name]
            if code in PERMANENT:
                self._leave_down(name, code, ran)
                continue
            delay = self.backoff.after(self._delay.get(name, 0.0), ran)
            self._delay[name] = delay
            self._due[name] = now + delay
            log.warning(
                "%s %s after %.1f s; restarting it in %.1f s",
                *(name, exit_reason(code), ran, delay),
            )
        for name in [n for n, due in self._due.items() if due <= now]:
            del self._due[name]
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self.spawn(name)

    def all_down(self) -> int | None:
        """The exit code of the first instance left down, once every instance is (none
        runs, none is due to restart); None while any runs or will run again."""
        if self.processes or self._due or not self.left_down:
            return None
        return next(iter(self.left_down.values()))

    def _leave_down(self, name: str, code: int, ran: float) -> None:
        self.left_down[name] = code
        del self.processes[name]
        log.error(
            "%s %s after %.1f s; a restart cannot fix that, so it stays down and the rest "
            "keep serving",
            *(name, exit_reason(code), ran),
        )


def _executed(start: Start) -> Child:
    """`start` as a process with an interpreter of its own."""
    output = None if start.log is None else open(start.log, "ab")  # noqa: SIM115  (the child's)
    command = [sys.executable, "-m", start.module, *start.argv]
    return subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=output, env=start.env)


def exit_reason(code: int) -> str:
    """`exited with 1`, `exited with 69 (an address it must listen on is in use or cannot be
    bound)` or `was killed by SIGKILL`."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code in PERMANENT:
        return f"exited with {code} ({PERMANENT[code]})"
    return f"exited with {code}"


def banner(settings: Settings) -> str:
    """How to call what this config serves: its first pipeline, with inputs of its shapes."""
    gateway = settings.services.gateway.listen
    name, pipeline = next(iter(settings.pipelines.items()))
    decoded = {s.input for s in pipeline.preprocess[:1] if isinstance(s, DecodeStep)}
    inputs = [
        _example_input(i, spec, spec.name in decoded) for i, spec in enumerate(pipeline.inputs)
    ]
    sent = ", ".join(f"x{i}" for i in range(len(inputs)))
    outputs = tuple(spec.name for spec in pipeline.outputs)
    return f"""
Strata is up. Gateway (KServe v2 gRPC): {gateway}   pipelines: {", ".join(settings.pipelines)}

  grpcurl -plaintext {gateway} inference.GRPCInferenceService/ServerReady

  python - <<'PY'
  import base64, numpy as np, tritonclient.grpc as tc
  client = tc.InferenceServerClient("{gateway}")
{"".join(inputs)}  result = client.infer("{name}", [{sent}])
  print({{name: result.as_numpy(name) for name in {outputs!r}}})
  PY

Ctrl-C stops every service.
"""


EXAMPLE_SIZE = 8  # each variable dimension after the batch, in the banner's example
# A real image for a pipeline that decodes one: a 64x64 gray PNG, 134 bytes.
EXAMPLE_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAIAAAAlC+aJAAAATUlEQVR42u3PQQ0AAAgEIDX5RTeFDzdoQCepz6aeE"
    "xAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQELi3oiwCAJt186UAAAAASUVORK5CYII="
)


def _example_input(index: int, spec: TensorSpec, image: bool = False) -> str:
    """Lines of the banner's client making input `index`: one row of zeros, of text, or
    (`image`: a decode step reads it) of a tiny PNG."""
    shape = [1] + [EXAMPLE_SIZE if size < 0 else size for size in spec.shape[1:]]
    if spec.datatype == "BYTES" and image:
        data = f'np.full({shape}, base64.b64decode("{EXAMPLE_PNG}"), dtype=object)'
    elif spec.datatype == "BYTES":
        data = f'np.full({shape}, b"an example", dtype=object)'
    else:  # numpy's name for a v2 datatype (FP32: float32), without importing numpy here
        data = f"np.zeros({shape}, np.{spec.datatype.lower().replace('fp', 'float')})"
    return (
        f'  x{index} = tc.InferInput("{spec.name}", {shape}, "{spec.datatype}")\n'
        f"  x{index}.set_data_from_numpy({data})\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata.tools.launch", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="deployment YAML file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launch %(message)s")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"launch: {one_line(str(exc))}\n")
        return ConfigInvalid.code
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    supervisor = Supervisor(args.config.resolve(), settings)
    try:
        supervisor.start_all()
    except StartFailed as exc:
        log.error("%s; stopped every service", exc)
        return exc.code if exc.code and exc.code > 0 else 1
    print(banner(settings), flush=True)
    while not stop.wait(0.2):
        supervisor.tend()
        code = supervisor.all_down()
        if code is not None:
            log.error("every service exited and none can be restarted; stopping with %d", code)
            return code
    codes = supervisor.stop_all()
    log.info("stopped: %s", ", ".join(f"{name} rc={code}" for name, code in codes.items()))
    return 1 if any(codes.values()) or supervisor.left_down else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
