"""The peers' own virtual environments under build/peers/, installed once from pinned files.

Each peer (MLServer, KServe) gets a venv of its own, never the project's: its packages pin
versions of grpcio, fastapi, pandas ... that Strata's do not. The constraint files are
committed beside this module (mlserver.txt, kserve.txt: `pip freeze` of a working install);
a stamp file holding the constraint file's hash says the venv is complete, so later runs reuse
it, and a changed constraint file reinstalls. An install that fails (no network, no wheel)
leaves no stamp and the reason, and the benchmark reports that peer as skipped.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
BUILD = HERE.parents[1] / "build" / "peers"
INSTALL_SECONDS = 900


@dataclass(frozen=True)
class Environment:
    """A peer's venv: what to install, from which constraints, where."""

    name: str  # mlserver, kserve
    packages: tuple[str, ...]  # top-level requirements; every version comes from constraints

    @property
    def constraints(self) -> Path:
        return HERE / f"{self.name}.txt"

    @property
    def folder(self) -> Path:
        return BUILD / f"{self.name}-venv"

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    @property
    def log(self) -> Path:
        return BUILD / f"{self.name}-install.log"

    @property
    def stamp(self) -> Path:
        return self.folder / ".installed"

    def fingerprint(self) -> str:
        return hashlib.sha256(self.constraints.read_bytes()).hexdigest()

    def ready(self) -> bool:
        return self.stamp.is_file() and self.stamp.read_text().strip() == self.fingerprint()


MLSERVER = Environment("mlserver", ("mlserver", "onnxruntime", "pillow", "tokenizers"))
KSERVE = Environment("kserve", ("kserve", "onnxruntime"))


class InstallFailed(RuntimeError):
    """The venv could not be built; the message says why, for the report."""


def ensure(env: Environment) -> Path:
    """The venv's python, installing it first unless its stamp matches; InstallFailed if not."""
    if env.ready():
        return env.python
    env.folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"installing {env.name} into {env.folder} (once; log {env.log})", flush=True)
    pip = [str(env.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(env.folder)],
        [*pip, "-c", str(env.constraints), *env.packages],
    ]
    with env.log.open("w") as log:
        for step in steps:
            _run(step, log, env)
    env.stamp.write_text(env.fingerprint() + "\n")
    return env.python


def _run(step: list[str], log: TextIO, env: Environment) -> None:
    log.write(f"$ {' '.join(step)}\n")
    log.flush()
    try:
        done = subprocess.run(step, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallFailed(f"{env.name} install failed: {exc}") from exc
    if done.returncode != 0:
        raise InstallFailed(
            f"{env.name} install failed (exit {done.returncode}): {_last_error(env.log)} "
            f"(log: {env.log})"
        )


def _last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if line.startswith("ERROR")]
    if errors:
        return errors[0][:300]  # pip's first error names the package; later ones point to docs
    return ([line for line in lines if line] or ["no output"])[-1][:300]
