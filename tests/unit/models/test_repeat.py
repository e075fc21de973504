"""The decoupled demo model (models/repeat.py): Triton's repeat_int32 tensors in, every
response at once out, and golden cases the inference service replays at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from models import repeat


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ort.InferenceSession]:
    out = tmp_path_factory.mktemp("repeat")
    repeat.write(out)
    path = out / "repository" / repeat.NAME / "1" / "model.onnx"
    return path.parent, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("length", [0, 1, 5])
def test_out_is_in_and_idx_counts_the_responses(session, length: int) -> None:
    _, runner = session
    out, idx = runner.run(["OUT", "IDX"], repeat.case(length))
    assert out.dtype == np.int32 and idx.dtype == np.uint32
    assert out.reshape(-1).tolist() == list(range(100, 100 + length))
    assert idx.reshape(-1).tolist() == list(range(length))
    assert out.shape == idx.shape == (length, 1)


def test_it_takes_triton_s_three_inputs_and_its_cases_are_written(session) -> None:
    folder, runner = session
    assert [(i.name, i.type) for i in runner.get_inputs()] == [
        ("IN", "tensor(int32)"),
        ("DELAY", "tensor(uint32)"),
        ("WAIT", "tensor(uint32)"),
    ]
    assert len(sorted((folder / "validation").glob("case_*.npz"))) == len(repeat.CASE_LENGTHS)
