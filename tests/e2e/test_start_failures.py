"""A service that cannot start says what and where in one line on stderr and exits with its
reason's code (docs/troubleshooting.md); the launcher stops at once when one does."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from bench.image_chain import image_config
from bench.images import PIPELINE as IMAGES
from strata.config import load_settings
from strata.config.tls import TlsSettings
from strata.tools.launch import StartFailed, Supervisor, wait_serving
from tests.support.system import DEFAULT_CONFIG, ROOT, free_port, make_config, running_system

REPOSITORY = ROOT / "build" / "repository"


def run(module: str, config: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run `module` (a layer, or a module path) until it exits; it must not crash."""
    module = module if "." in module else f"services.{module}"
    done = subprocess.run(
        [sys.executable, "-m", module, "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def start(module: str, config: Path) -> tuple[int, str]:
    """Run `module`; its exit code and its last line on stderr, once it has exited."""
    done = run(module, config)
    return done.returncode, done.stderr.strip().splitlines()[-1]


@contextmanager
def taken(address: str) -> Iterator[None]:
    """`address` held by a listening socket of another program."""
    host, _, port = address.rpartition(":")
    with socket.socket() as holder:
        holder.bind((host, int(port)))
        holder.listen()
        yield


def spare(config: Path) -> str:
    """A free loopback address that `config` does not name."""
    named = config.read_text()
    while True:
        address = f"127.0.0.1:{free_port()}"
        if address not in named:
            return address


def with_metrics(folder: Path) -> tuple[Path, str, str]:
    """A config on free ports whose postprocess also serves metrics; its two addresses."""
    config = make_config(folder)
    metrics = spare(config)
    config = make_config(folder, {"services": {"postprocess": {"metrics": metrics}}})
    return config, load_settings(config).services.postprocess.listen, metrics


def test_a_listen_address_in_use_is_one_line_and_exit_69(tmp_path: Path) -> None:
    config, listen, _ = with_metrics(tmp_path)
    with taken(listen):
        code, line = start("postprocess", config)
    assert (code, line) == (69, f"postprocess: {listen} (listen) already in use")


def test_a_metrics_address_in_use_is_one_line_and_exit_69(tmp_path: Path) -> None:
    config, _, metrics = with_metrics(tmp_path)
    with taken(metrics):
        code, line = start("postprocess", config)
    assert (code, line) == (69, f"postprocess: {metrics} (metrics) already in use")


@pytest.mark.parametrize("processes", [1, 2])
def test_a_rest_address_in_use_stops_the_started_grpc_server_and_is_one_line(
    tmp_path: Path, processes: int
) -> None:
    """With several gateway processes, their parent finds it before any of them starts."""
    config = make_config(tmp_path, {"gateway": {"processes": processes}})
    rest = load_settings(config).services.gateway.rest
    with taken(rest):
        code, line = start("gateway", config)
    assert (code, line) == (69, f"gateway: {rest} (REST) already in use")


def test_the_gateway_binds_its_probe_port_once_beside_an_admin_port(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    probe, admin = spare(config), spare(config)
    changes = {
        "tls": {"probe_listen": probe},
        "services": {"gateway": {"admin_listen": admin}},
        "gateway": {"admin_token": "t" * 32},
    }
    config = make_config(tmp_path, changes)
    gateway = subprocess.Popen(
        [sys.executable, "-m", "services.gateway", "--config", str(config)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_serving(probe, 60, TlsSettings()) and wait_serving(admin, 5, TlsSettings())
    finally:
        gateway.send_signal(signal.SIGTERM)
        _, stderr = gateway.communicate(timeout=30)
    assert gateway.returncode == 0, stderr


def test_a_missing_key_is_one_line_and_exit_66(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    config = make_config(tmp_path, {"tls": {"enabled": True, "certs": str(certs)}})
    code, line = start("postprocess", config)
    key = certs / "postprocess" / "tls.key"
    assert code == 66
    assert line == (
        f"postprocess: TLS identity 'postprocess': cannot read {key} (No such file or "
        "directory); run `make certs`, or mount the identity's Secret there"
    )


def test_a_model_that_will_not_load_is_one_line_and_exit_65(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    for model in ("digits", "tabular", "digits-large"):
        shutil.copytree(REPOSITORY / model, repository / model)
    (repository / "digits" / "2" / "model.onnx").write_bytes(b"not a model")
    config = make_config(tmp_path, {"repository": str(repository)})
    code, line = start("inference", config)
    assert code == 65
    assert line.startswith(
        f"inference-a: repository {repository}: model 'digits' version 2 refused: "
        "cannot open model.onnx: "
    ), line


def test_a_config_error_is_one_line_and_exit_78_for_a_service_and_the_launcher(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, {"server": {"grace_seconds": "soon"}})
    problem = (
        f"config {config} is invalid: server.grace_seconds: Input should be a valid number, "
        "unable to parse string as a number"
    )
    assert start("postprocess", config) == (78, f"postprocess: {problem}")
    assert start("strata.tools.launch", config) == (78, f"launch: {problem}")


def test_the_launcher_stops_everything_the_moment_one_process_cannot_start(
    tmp_path: Path,
) -> None:
    config, _, metrics = with_metrics(tmp_path)
    supervisor = Supervisor(config, load_settings(config), log_dir=tmp_path)
    started = time.monotonic()
    with taken(metrics), pytest.raises(StartFailed) as failed:
        supervisor.start_all(timeout=60)
    took = time.monotonic() - started
    assert (failed.value.name, failed.value.code) == ("postprocess", 69)
    assert "exited with 69 (an address it must listen on is in use" in str(failed.value)
    assert took < 30, f"noticed after {took:.1f} s, not at once"
    assert not supervisor.processes, "every other process was stopped"
    log = (tmp_path / "postprocess.log").read_text()
    assert log.strip().splitlines()[-1] == f"postprocess: {metrics} (metrics) already in use"


def test_make_run_exits_with_the_failed_process_code(tmp_path: Path) -> None:
    config, listen, _ = with_metrics(tmp_path)
    with taken(listen):
        done = run("strata.tools.launch", config)
    assert done.returncode == 69
    assert f"postprocess: {listen} (listen) already in use" in done.stderr.splitlines()
    assert "launch postprocess exited with 69" in done.stderr


def test_the_launcher_leaves_down_a_process_no_restart_can_fix_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, listen, _ = with_metrics(tmp_path)
    supervisor = Supervisor(config, load_settings(config), log_dir=tmp_path)
    with taken(listen):
        supervisor.spawn("postprocess").wait(timeout=60)
        for _ in range(3):
            supervisor.tend()
            time.sleep(0.3)
    assert supervisor.left_down == {"postprocess": 69}
    assert not supervisor.restarts and not supervisor.processes
    assert supervisor.all_down() == 69  # nothing left running: the launcher stops with it
    said = [r.getMessage() for r in caplog.records if "postprocess" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("postprocess exited with 69 (an address it must listen on is in ")
    assert said[0].endswith(
        "s; a restart cannot fix that, so it stays down and the rest keep serving"
    )


def test_a_second_launcher_on_ports_another_deployment_holds_is_not_up(tmp_path: Path) -> None:
    """The health checks on its ports are answered SERVING by the first deployment's
    processes, not its own: it waits for its own, which exit 69, and stops with that."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    with running_system(tmp_path / "first") as first:
        second = Supervisor(first.config, first.settings, log_dir=tmp_path / "second")
        with pytest.raises(StartFailed) as failed:
            second.start_all(timeout=60)
        assert failed.value.code == 69, str(failed.value)
        assert not second.processes, "every other process was stopped"
        assert first.failed() is None, "the first deployment keeps serving"


def miswired_images(folder: Path, change: Callable[[list[dict]], list[dict]]) -> Path:
    """bench.image_chain's image config (a JPEG through decode, resize, crop, normalize and
    layout to a model taking `image` FP32 [N, 3, 224, 224]) with its steps changed."""
    config = image_config(DEFAULT_CONFIG, folder)
    raw = yaml.safe_load(config.read_text())
    pipeline = raw["pipelines"][IMAGES]
    pipeline["preprocess"] = change(pipeline["preprocess"])
    config.write_text(yaml.safe_dump(raw))
    return config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda steps: [*steps[:-1], {**steps[-1], "output": "images"}],
            "model 'vision' version 1 takes input 'image', which no preprocess step makes "
            "(preprocess ends with ['images']); preprocess step 'layout' gives 'images' instead",
        ),
        (
            lambda steps: steps[:-1],
            "preprocess step 'normalize' gives 'image' of shape [1, 224, 224, 3] from a "
            "synthetic request, but model 'vision' version 1 takes [-1, 3, 224, 224] (it "
            "takes channels first: a `layout` step with to: CHW turns them)",
        ),
    ],
    ids=["layout-writes-another-name", "layout-left-out"],
)
def test_a_miswired_image_pipeline_stops_the_system_at_start(
    tmp_path: Path, change: Callable[[list[dict]], list[dict]], message: str
) -> None:
    """Issue 51: both started, and every request then failed as the client's fault."""
    config = miswired_images(tmp_path, change)
    assert start("preprocess", config) == (65, f"preprocess: pipeline {IMAGES!r}: {message}")
    done = run("strata.tools.launch", config, timeout=120)
    assert done.returncode == 65
    assert f"preprocess: pipeline {IMAGES!r}: {message}" in done.stderr.splitlines()
    assert "exited with 65 (a model, pipeline, step or rule cannot be loaded)" in done.stderr
