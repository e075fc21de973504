"""Services forked from a zygote (strata.process.zygote) keep what a process of their own
had: their environment, arguments, log file and exit code, death by signal read as Popen
reads it, and a drain on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from strata.config import load_settings
from strata.process.forked import SWITCH, Forked, Start, Zygote, ZygoteRefused
from strata.tools.launch import Supervisor, exit_reason, start_on_fresh_ports
from tests.support.system import ROOT, make_config

CHILD = "tests.e2e.clients.forked_child"


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    started = Zygote(dict(os.environ), ROOT)
    try:
        yield started
    finally:
        started.close()


def fork(zygote: Zygote, log: Path, mark: str, *argv: str) -> Forked:
    env = {**os.environ, "ZYGOTE_TEST_MARK": mark}
    return zygote.fork(Start(log.stem, CHILD, list(argv), env, log))


def said(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[0])


def test_each_fork_has_its_own_environment_arguments_log_and_exit_code(
    zygote: Zygote, tmp_path: Path
) -> None:
    first = fork(zygote, tmp_path / "first.log", "one", "3", "--flag")
    second = fork(zygote, tmp_path / "second.log", "two", "4")
    assert (first.wait(timeout=60), second.wait(timeout=60)) == (3, 4)
    assert said(tmp_path / "first.log") == {
        "argv": ["3", "--flag"],
        "mark": "one",
        "ppid": zygote.process.pid,
    }
    assert said(tmp_path / "second.log")["mark"] == "two"
    assert "atexit ran" in (tmp_path / "first.log").read_text()  # it exits as Python does
    assert psutil.Process(zygote.process.pid).name() != "first"  # the name is the child's


def test_a_crash_is_code_1_with_its_traceback_in_its_own_log(
    zygote: Zygote, tmp_path: Path
) -> None:
    crashed = fork(zygote, tmp_path / "crash.log", "c", "raise")
    assert crashed.wait(timeout=60) == 1
    assert "RuntimeError: a crash in a forked child" in (tmp_path / "crash.log").read_text()


def test_death_by_signal_reads_as_popen_gives_it(zygote: Zygote, tmp_path: Path) -> None:
    waiting = fork(zygote, tmp_path / "waiting.log", "w", "wait")
    with pytest.raises(subprocess.TimeoutExpired):
        waiting.wait(timeout=0.5)
    assert waiting.poll() is None
    waiting.kill()
    assert waiting.wait(timeout=60) == -signal.SIGKILL
    assert exit_reason(waiting.returncode or 0) == "was killed by SIGKILL"
    waiting.send_signal(signal.SIGTERM)  # once reaped, a signal goes nowhere


def test_a_signal_once_the_service_has_stopped_does_not_cut_its_exit_short(
    zygote: Zygote, tmp_path: Path
) -> None:
    """After a Ctrl-C to the terminal's group each service stops, and the launcher's SIGTERM
    may reach one on its way out: its code stays that of its own clean stop."""
    log = tmp_path / "linger.log"
    lingering = fork(zygote, log, "l", "linger")
    deadline = time.monotonic() + 60
    while not log.exists() or "exiting" not in log.read_text():
        assert time.monotonic() < deadline and lingering.poll() is None
        time.sleep(0.05)
    lingering.send_signal(signal.SIGTERM)
    assert lingering.wait(timeout=60) == 0


def alone(folder: Path, env: dict[str, str] | None = None) -> Supervisor:
    """A supervisor of the default config's postprocess alone, started (on fresh ports if
    another process took one first)."""

    def build() -> Supervisor:
        config = make_config(folder)
        system = Supervisor(config, load_settings(config), log_dir=folder, env=env)
        system.instances = {"postprocess": system.instances["postprocess"]}
        return system

    return start_on_fresh_ports(build)


def test_a_forked_service_serves_for_its_launcher_and_drains_on_sigterm(tmp_path: Path) -> None:
    # Started means SERVING for this launcher's id, read from the environment it was given.
    system = alone(tmp_path)
    try:
        process = system.processes["postprocess"]
        zygote = psutil.Process(process.pid).parent()
        assert isinstance(process, Forked)
        assert zygote is not None and zygote.parent().pid == os.getpid()
        assert psutil.Process(process.pid).name() == "postprocess"
    finally:
        codes = system.stop_all()
    assert codes == {"postprocess": 0}
    log = (tmp_path / "postprocess.log").read_text()
    assert "draining in-flight calls" in log and '"stopped"' in log
    assert not zygote.is_running(), "stop_all ends the zygote too"


def test_fork_off_starts_each_service_with_its_own_interpreter(tmp_path: Path) -> None:
    system = alone(tmp_path, env={SWITCH: "0"})
    try:
        process = system.processes["postprocess"]
        assert isinstance(process, subprocess.Popen)
        assert psutil.Process(process.pid).parent().pid == os.getpid()
    finally:
        assert system.stop_all() == {"postprocess": 0}


def test_an_instance_started_with_another_environment_gets_its_own_interpreter(
    tmp_path: Path,
) -> None:
    """What Python and the preloaded libraries read as they load cannot change after a
    fork, so only an instance with the zygote's environment is forked."""
    system = alone(tmp_path)
    try:
        assert isinstance(system.processes["postprocess"], Forked)
        system.stop("postprocess")
        system.env = {"PYTHONTRACEMALLOC": "1"}
        assert isinstance(system.start("postprocess"), subprocess.Popen)
    finally:
        system.stop_all()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="OpenBLAS starts no thread on 1 core")
def test_a_zygote_that_finds_a_thread_after_preloading_refuses_to_fork() -> None:
    """numpy's OpenBLAS, told to use two threads, starts one as it loads; a fork would keep
    only the thread that forks, so the zygote says so and the launcher execs instead."""
    with pytest.raises(ZygoteRefused, match="2 threads after preloading"):
        Zygote({**os.environ, "OPENBLAS_NUM_THREADS": "2"}, ROOT)
