"""System shared memory at the gateway: regions per client, bounds and limits checked before
a byte is read, inputs read beside raw ones, outputs written where asked."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from services.gateway.serving.shared_memory import (
    SharedMemory,
    output_places,
    with_inputs,
    write_outputs,
)
from strata.config.gateway import SharedMemory as Settings
from strata.errors import AlreadyExists, InvalidArgument, NotFound, Overloaded, PermissionDenied
from strata.wire import codec


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    return tmp_path


def memory(root: Path, **overrides) -> SharedMemory:
    settings = Settings(enabled=True, root=root, **overrides)
    return SharedMemory(lambda: settings)


def test_a_region_is_its_clients_alone(root: Path) -> None:
    shared = memory(root)
    shared.register("alice", "r", "/obj", 16, 32)
    assert shared.read("alice", "r", 4, 4, "input 'x'") == bytes([20, 21, 22, 23])
    assert [r.name for r in shared.status("alice")] == ["r"] and shared.status("bob") == []
    with pytest.raises(InvalidArgument, match="no shared memory region 'r' is registered"):
        shared.read("bob", "r", 0, 4, "input 'x'")
    shared.unregister("bob", "r")  # nothing of bob's: alice keeps hers
    assert shared.status("alice", "r")[0].byte_size == 32


def test_bytes_past_the_region_are_refused_before_any_read(root: Path) -> None:
    shared = memory(root)
    shared.register("c", "r", "/obj", 16, 32)
    with pytest.raises(InvalidArgument, match="bytes 30 to 34 lie outside"):
        shared.read("c", "r", 30, 4, "input 'x'")


def test_an_object_that_shrank_fails_the_request_not_the_process(root: Path) -> None:
    shared = memory(root)
    shared.register("c", "r", "/obj", 16, 32)
    os.truncate(root / "obj", 20)
    with pytest.raises(InvalidArgument, match="shrank"):
        shared.read("c", "r", 0, 32, "input 'x'")


@pytest.mark.parametrize(
    ("name", "key", "offset", "size", "error", "words"),
    [
        ("r", "/../obj", 0, 8, InvalidArgument, "must be a name like /input0"),
        ("r", "/nothing", 0, 8, NotFound, "no shared memory object '/nothing'"),
        ("r", "/obj", 60, 8, InvalidArgument, "has 64 bytes; the region needs 68"),
        ("r", "/obj", 0, 0, InvalidArgument, "byte_size 0 must be between 1 and"),
        ("", "/obj", 0, 8, InvalidArgument, "needs a name of 1 to 256"),
        ("r" * 257, "/obj", 0, 8, InvalidArgument, "needs a name of 1 to 256"),
    ],
)
def test_what_cannot_be_registered(root, name, key, offset, size, error, words) -> None:
    with pytest.raises(error, match=words):
        memory(root).register("c", name, key, offset, size)


def test_limits_and_names_are_checked_before_opening(root: Path) -> None:
    shared = memory(root, max_regions_per_client=1)
    shared.register("c", "r", "/obj", 0, 8)
    with pytest.raises(AlreadyExists):
        shared.register("c", "r", "/obj", 0, 8)
    with pytest.raises(Overloaded, match="max_regions_per_client"):
        shared.register("c", "s", "/obj", 0, 8)
    with pytest.raises(PermissionDenied, match=r"gateway\.shared_memory\.enabled"):
        SharedMemory(lambda: Settings()).status("c")


def test_inputs_from_shared_memory_take_their_place_among_raw_ones(root: Path) -> None:
    shared = memory(root)
    shared.register("c", "r", "/obj", 0, 64)
    request = codec.build_request("p", {"a": np.ones((1, 2), np.uint8)})
    placed = request.inputs.add(name="b", datatype="UINT8", shape=[1, 4])
    placed.parameters["shared_memory_region"].string_param = "r"
    placed.parameters["shared_memory_byte_size"].int64_param = 4
    placed.parameters["shared_memory_offset"].int64_param = 8
    arrays = codec.request_inputs(with_inputs(shared, "c", request))
    assert arrays["a"].tolist() == [[1, 1]] and arrays["b"].tolist() == [[8, 9, 10, 11]]
    placed.parameters["shared_memory_byte_size"].int64_param = 5
    with pytest.raises(InvalidArgument, match="needs 4 bytes, got 5"):
        with_inputs(shared, "c", request)


def test_outputs_are_written_where_asked_and_checked_first(root: Path) -> None:
    shared = memory(root)
    shared.register("c", "r", "/obj", 0, 64)
    request = codec.build_request("p", {"a": np.ones((1, 2), np.uint8)})
    asked = request.outputs.add(name="y")
    asked.parameters["shared_memory_region"].string_param = "r"
    asked.parameters["shared_memory_byte_size"].int64_param = 8
    places = output_places(shared, "c", request)
    written = write_outputs(shared, "c", places, {"y": np.array([[1.5, 2.5]], np.float32)})
    assert written["y"].size == 8
    assert np.frombuffer((root / "obj").read_bytes()[:8], np.float32).tolist() == [1.5, 2.5]
    with pytest.raises(InvalidArgument, match="takes 12 bytes, more than the 8 given"):
        write_outputs(shared, "c", places, {"y": np.zeros((1, 3), np.float32)})
    asked.parameters["shared_memory_byte_size"].int64_param = 128
    with pytest.raises(InvalidArgument, match="lie outside"):
        output_places(shared, "c", request)


def test_a_link_in_the_root_is_not_followed(root: Path, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret"
    outside.write_bytes(bytes(64))
    (root / "link").symlink_to(outside)
    with pytest.raises(InvalidArgument, match="shared memory object '/link'"):
        memory(root).register("c", "r", "/link", 0, 8)
