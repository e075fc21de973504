"""The wheel installs two names, as the design card lays the tree out: `strata` (the shared
package) and `services` (one folder a layer). Installed without the checkout, each service
starts as `python -m services.<layer>`, a user's own `convert` package lives beside them, and
the `strata` command runs from `strata.command` (README, Decisions)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built offline from a copy of the sources (the build stays out of
    the checkout's own build/ folder, which holds the demo models)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("strata", "services"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("strata-*.whl")
    return built


def test_the_wheel_holds_the_strata_and_services_names(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        listing = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = archive.read(listing).decode()
    assert {top for top in tops if not top.endswith(".dist-info")} == {"strata", "services"}
    assert "strata = strata.command:main" in entry_points


def test_the_installed_services_start_without_the_checkout(wheel: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    # The dependencies come from the project's environment as a plain path entry: its own
    # editable `strata` hook (a .pth there) is not run, so `strata` is the installed wheel.
    site = next((fresh / "lib").glob("python3.*/site-packages"))
    deps = sysconfig.get_paths()["purelib"]
    (site / "project-deps.pth").write_text(f"{deps}\n")
    user = tmp_path / "user"
    (user / "convert").mkdir(parents=True)
    (user / "convert" / "__init__.py").write_text("OWNER = 'user convert'\n")
    check = (
        "import services, convert, strata, services.gateway.app, services.inference.app, "
        "services.preprocess.app, services.postprocess.app, strata.convert.cli, strata.command\n"
        "assert convert.OWNER == 'user convert'\n"
        f"assert strata.__file__.startswith({str(fresh)!r}), strata.__file__\n"
        f"assert services.__file__.startswith({str(fresh)!r}), services.__file__\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [str(python), "-c", check], cwd=user, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
    command = subprocess.run(
        [str(fresh / "bin" / "strata"), "--help"],
        cwd=user,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert command.returncode == 0, command.stderr
    assert "convert" in command.stdout and "admin" in command.stdout
    service = subprocess.run(
        [str(python), "-m", "services.gateway", "--help"],
        cwd=user,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert service.returncode == 0, service.stderr
    assert "python -m services.gateway" in service.stdout
