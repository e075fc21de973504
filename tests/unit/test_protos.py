"""The generated stubs exist, are current, and keep the published v2 field numbers."""

from pathlib import Path

import pytest

from scripts import gen_protos
from tests.support.system import ROOT


def stubs(folder: Path, root: Path) -> list[Path]:
    """The generated stubs (.py, .pyi) under `folder`, relative to `root`: not their bytecode,
    which an interpreter that writes it leaves beside them."""
    return sorted(p.relative_to(root) for p in folder.rglob("*_pb2*.py*") if p.suffix != ".pyc")


GENERATED = stubs(ROOT / "strata" / "proto", ROOT)


def test_stubs_are_present_for_every_proto() -> None:
    for proto in (ROOT / "protos").rglob("*.proto"):
        stem = proto.relative_to(ROOT / "protos").with_suffix("")
        for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"):
            path = ROOT / f"{stem}{suffix}"
            assert path.exists(), f"{path} missing: run `make proto`"


def test_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    gen_protos.generate(tmp_path)
    fresh = stubs(tmp_path, tmp_path)
    assert fresh == GENERATED
    for path in fresh:
        current = (ROOT / path).read_bytes()
        assert current == (tmp_path / path).read_bytes(), f"{path} is stale: run `make proto`"


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        ("ModelInferRequest", "raw_input_contents", 7),
        ("ModelInferRequest", "outputs", 6),
        ("ModelInferResponse", "raw_output_contents", 6),
        ("ModelInferRequest.InferInputTensor", "contents", 5),
        ("InferTensorContents", "bytes_contents", 8),
        ("ModelStreamInferResponse", "infer_response", 2),
        ("InferParameter", "double_param", 4),
    ],
)
def test_v2_field_numbers(message: str, field: str, number: int) -> None:
    from strata.proto.inference import grpc_service_pb2

    descriptor = grpc_service_pb2.DESCRIPTOR.message_types_by_name[message.split(".")[0]]
    for nested in message.split(".")[1:]:
        descriptor = descriptor.nested_types_by_name[nested]
    assert descriptor.fields_by_name[field].number == number
