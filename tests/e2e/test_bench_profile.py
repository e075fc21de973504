"""The per-process benchmarks in their smoke mode: the image chain reports every Strata
process's CPU per answered request, and bench.profile samples every process with py-spy
and writes each one's shares (never how fast)."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench
PROCESSES = ("gateway", "preprocess-0", "preprocess-1", "inference-a", "postprocess")


def test_the_image_chain_reports_each_process_cpu_per_request(tmp_path: Path) -> None:
    run_quick("bench.image_chain", tmp_path, 300)
    table = (tmp_path / "image_chain.md").read_text().split("by process")[1]
    for process in (*PROCESSES, "**all**"):
        row = next(line for line in table.splitlines() if f"| Strata | {process} |" in line)
        cells = [cell.strip() for cell in row.split("|")[3:-1]]
        assert len(cells) == 3 and all(float(cell) >= 0 for cell in cells), row


def test_the_profile_samples_every_process_and_writes_its_shares(tmp_path: Path) -> None:
    run_quick("bench.profile", tmp_path, 300, "--photo-size", "320x240")
    table = (tmp_path / "profile_images.md").read_text()
    assert (
        "| process | busy samples | work | (de)serialising | gRPC | loop | Strata | other |"
        in table
    )
    for process in PROCESSES:
        row = next(line for line in table.splitlines() if line.startswith(f"| {process} |"))
        assert int(row.split("|")[2]) >= 0, row
    preprocess = next(line for line in table.splitlines() if line.startswith("| preprocess-0 |"))
    assert int(preprocess.split("|")[2]) > 0, "a busy replica was sampled"
