"""docs/your-own-model.md cannot go stale: every `sh` block of it runs here, in order, each
part (the scikit-learn one; the PyTorch one, where PyTorch is installed) in an empty folder,
as a user would run them (a block starting `# in a second terminal` runs in the background
until the part ends). Only the addresses differ: the services get free ports (STRATA_
variables), and the guide's are replaced by them in its commands."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.system import ROOT, free_port

GUIDE = ROOT / "docs" / "your-own-model.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
BACKGROUND = "# in a second terminal"
IMAGES = "## A PyTorch image model"
REST, GRPC = "127.0.0.1:8000", "127.0.0.1:8001"


def blocks(part: int | None = None) -> list[str]:
    """The guide's sh blocks: all, or those of part 0 (scikit-learn) or 1 (PyTorch)."""
    text = GUIDE.read_text()
    parts = text.split(f"\n{IMAGES}\n")
    return BLOCK.findall(text if part is None else parts[part])


def environment() -> tuple[dict[str, str], dict[str, str]]:
    """The guide's environment (its Python first on PATH, STRATA), with every service on a
    free port; and the guide's addresses -> the ones used."""
    ports = {name: f"127.0.0.1:{free_port()}" for name in ("rest", "grpc", "pre", "inf", "post")}
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "STRATA": str(ROOT),
        "STRATA_SERVICES__GATEWAY__REST": ports["rest"],
        "STRATA_SERVICES__GATEWAY__LISTEN": ports["grpc"],
        "STRATA_SERVICES__PREPROCESS__LISTEN": ports["pre"],
        "STRATA_SERVICES__INFERENCE__A__LISTEN": ports["inf"],
        "STRATA_SERVICES__POSTPROCESS__LISTEN": ports["post"],
    }
    return env, {REST: ports["rest"], GRPC: ports["grpc"]}


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        os.killpg(process.pid, signal.SIGTERM)  # its own session: the launcher and its services
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def test_the_guide_has_its_steps() -> None:
    text = "\n".join(blocks())
    for command in ("fit_stats", "train.py", "strata.tools.launch", "ask.py", "/infer"):
        assert command in text
    for part in (0, 1):
        assert sum(block.startswith(BACKGROUND) for block in blocks(part)) == 1


def run_part(part: int, folder: Path, background: list[subprocess.Popen]) -> list[str]:
    """Run the part's blocks in `folder`; the standard output of each one in the foreground."""
    env, addresses = environment()
    outputs = []
    for block in blocks(part):
        for ours, theirs in addresses.items():
            block = block.replace(ours, theirs)
        if block.startswith(BACKGROUND):
            log = (folder / "launch.log").open("w")
            background.append(
                subprocess.Popen(
                    ["bash", "-c", block],
                    cwd=folder,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            continue
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    return outputs


def answers(outputs: list[str]) -> list[str]:
    """The lines of the block that printed the pipeline's answers."""
    return next(out for out in outputs if "answered" in out).splitlines()


def test_the_scikit_learn_part_runs_and_answers(
    tmp_path: Path, background: list[subprocess.Popen]
) -> None:
    outputs = run_part(0, tmp_path, background)
    lines = answers(outputs)
    pattern = r"class_(\d): answered (class_\1|uncertain) \(\d\.\d\d\)"
    assert len(lines) == 4 and all(re.fullmatch(pattern, line) for line in lines), lines
    assert '"name":"cultivar"' in outputs[-1].replace(" ", "")


# Exports a network, converts it and starts a system: over the suite's 120 s on a loaded
# machine; each command keeps its own 180 s bound.
@pytest.mark.timeout(300)
def test_the_pytorch_part_runs_and_answers(
    tmp_path: Path, background: list[subprocess.Popen]
) -> None:
    pytest.importorskip("torch", reason="the PyTorch part needs the convert extra (.[convert])")
    lines = answers(run_part(1, tmp_path, background))
    pattern = r"(\d): answered (\1|uncertain) \(\d\.\d\d\)"
    assert len(lines) == 4 and all(re.fullmatch(pattern, line) for line in lines), lines
    assert sum("uncertain" not in line for line in lines) >= 3, lines
