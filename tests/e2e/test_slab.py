"""Photos' crops from preprocess to the gateway and on to inference through shared-memory
slabs (issue 46): the answers equal those through bytes; a flight larger than the slab goes as
bytes; a flight's photos cut into parts for two replicas by ref answer as each alone; a slab a
receiver cannot open fails with a server's error, never the client's, and bytes follow; a
killed preprocess's slab is unlinked when it starts again."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from bench.deployment import running
from bench.image_chain import MODEL, image_config
from bench.images import PIPELINE, photo_jpeg
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import Supervisor
from strata.wire import codec
from strata.wire.slab import ASK, PREFIX, READS, Ref, Slab, Slabs, domain
from tests.support.system import DEFAULT_CONFIG

SLAB_MIB = 1  # six crops of 147 KiB: one photo fits, a flight of eight does not
OBJECTIVE_MS = 60_000


@contextlib.contextmanager
def image_system(folder: Path, slab: Path | None) -> Iterator[Supervisor]:
    config = image_config(DEFAULT_CONFIG, folder, OBJECTIVE_MS)
    raw = yaml.safe_load(config.read_text())
    raw["server"]["slab"] = (
        {"enabled": False}
        if slab is None
        else {"enabled": True, "root": str(slab), "size_mib": SLAB_MIB}
    )
    config.write_text(yaml.safe_dump(raw))
    run = folder / "run"
    run.mkdir()
    with running(config, run) as (supervisor, _):
        yield supervisor


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def bytes_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with image_system(tmp_path_factory.mktemp("bytes"), None) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def slab_system(tmp_path_factory: pytest.TempPathFactory, root: Path) -> Iterator[Supervisor]:
    with image_system(tmp_path_factory.mktemp("slab"), root) as supervisor:
        yield supervisor


PHOTOS = [photo_jpeg(640, 480), photo_jpeg(480, 640), photo_jpeg(800, 600)]


def ask(supervisor: Supervisor, count: int) -> dict[str, np.ndarray] | grpc.RpcError:
    """The gateway's answer to `count` photos in one request, or its error."""
    images = np.array([PHOTOS[i % len(PHOTOS)] for i in range(count)], dtype=object)
    with grpc.insecure_channel(supervisor.address("gateway")) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        try:
            reply = stub.ModelInfer(codec.build_request(PIPELINE, {"image": images}), timeout=60)
        except grpc.RpcError as exc:
            return exc
    return codec.response_outputs(reply)


def slabs_of(root: Path, role: str = "preprocess") -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(f"{PREFIX}{role}-"))


def preprocesses(supervisor: Supervisor) -> list[str]:
    return [name for name, i in supervisor.instances.items() if i.service == "preprocess"]


def test_answers_through_the_slab_equal_those_through_bytes(
    bytes_system: Supervisor, slab_system: Supervisor, root: Path
) -> None:
    for count in (1, 3, 8):  # eight crops outgrow the slab: they go as bytes
        expected, got = ask(bytes_system, count), ask(slab_system, count)
        assert isinstance(expected, dict) and isinstance(got, dict), (expected, got)
        assert expected.keys() == got.keys()
        for name in expected:
            np.testing.assert_array_equal(expected[name], got[name])
    (gateway,) = slabs_of(root, "gateway")
    generations = np.frombuffer((root / gateway).read_bytes()[16:4096], "<u8")
    assert generations.any(), "the gateway sent inference its inputs through its slab"


def process_call(
    supervisor: Supervisor, count: int, asked: str | None, slab: Slab | None = None
) -> v1.Result:
    """Preprocess's result for `count` photos, called directly, asking for slabs from
    `asked`, the photos placed in the caller's `slab` where given."""
    images = np.array([PHOTOS[0]] * count, dtype=object)
    item = v1.Request(id="1", pipeline=PIPELINE, tensors=codec.arrays_to_tensors({"image": images}))
    if asked is not None:
        item.parameters[ASK] = asked
    if slab is not None:
        (tensor,) = item.tensors
        ref = slab.place(np.frombuffer(tensor.data, np.uint8))
        assert ref is not None
        tensor.slab, tensor.data = ref.text(), b""
    with grpc.insecure_channel(supervisor.address(preprocesses(supervisor)[0])) as channel:
        reply = preprocess_pb2_grpc.PreprocessStub(channel).Process(
            v1.ProcessRequest(requests=[item]), timeout=60
        )
    return reply.results[0]


def process(supervisor: Supervisor, count: int, asked: str | None) -> v1.Tensor:
    """Preprocess's crops of `count` photos, called directly, asking for slabs from `asked`."""
    (tensor,) = process_call(supervisor, count, asked).tensors
    return tensor


def test_preprocess_names_its_slab_only_to_a_caller_that_shares_it(
    slab_system: Supervisor, root: Path
) -> None:
    plain = process(slab_system, 2, None)
    assert plain.data and not plain.slab
    assert process(slab_system, 2, "another-host/1").data  # another domain: bytes
    placed = process(slab_system, 2, domain(root))
    assert placed.slab and not placed.data
    assert Slabs(root).read(Ref.parse(placed.slab), "crops") == plain.data
    assert process(slab_system, 8, domain(root)).data  # larger than the slab: bytes


def test_preprocess_reads_its_callers_photos_from_the_callers_slab_and_says_it_does(
    slab_system: Supervisor, root: Path
) -> None:
    plain = process_call(slab_system, 2, None)
    assert ASK not in plain.info  # a caller that asked nothing is told nothing
    assert ASK not in process_call(slab_system, 2, "another-host/1").info
    slab = Slab(root, "gateway", 1 << 20, 1, 30.0)
    try:
        through = process_call(slab_system, 2, "another-host/1", slab)
        assert list(through.tensors) == list(plain.tensors)  # read from the slab all the same
        assert process_call(slab_system, 2, domain(root)).info[ASK] == READS
    finally:
        slab.close()
    unlinked = Slab(root, "gateway", 1 << 20, 1, 30.0)
    unlinked.close()  # its name gone, as if this host's /dev/shm were not preprocess's
    with pytest.raises(grpc.RpcError) as caught:
        process_call(slab_system, 1, None, unlinked)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot open shared memory slab" in (caught.value.details() or "")


def test_a_killed_preprocess_slab_goes_at_restart_and_an_unreadable_one_is_the_servers_fault(
    bytes_system: Supervisor, slab_system: Supervisor, root: Path
) -> None:
    names = preprocesses(slab_system)
    before = slabs_of(root)
    assert len(before) == len(names)  # one slab a preprocess process
    for name in names:
        slab_system.stop(name, signal.SIGKILL)
    assert slabs_of(root) == before  # a killed process unlinks nothing
    for name in names:
        slab_system.start(name)
    after = slabs_of(root)
    assert len(after) == len(names) and not set(after) & set(before), (before, after)
    # As if the gateway's /dev/shm were not preprocess's: the slabs' names are gone.
    for key in after:
        (root / key).unlink()
    first = ask(slab_system, 1)
    assert isinstance(first, grpc.RpcError) and first.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot open shared memory slab" in (first.details() or "")
    expected = ask(bytes_system, 2)
    for _ in range(2):  # bytes from now on
        got = ask(slab_system, 2)
        assert isinstance(got, dict) and isinstance(expected, dict), got
        for name in expected:
            np.testing.assert_array_equal(expected[name], got[name])


def infer_direct(
    supervisor: Supervisor, crops: v1.Tensor, slab: Slab | None, asked: str
) -> v2.ModelInferResponse | grpc.RpcError:
    """inference-a's answer to `crops`, sent as bytes or (`slab`) through a slab."""
    request = v2.ModelInferRequest(model_name=MODEL, model_version="1")
    tensor = request.inputs.add(name=crops.name, datatype=crops.datatype, shape=crops.shape)
    request.parameters[ASK].string_param = asked
    ref = slab.place(np.frombuffer(crops.data, np.uint8)) if slab is not None else None
    request.raw_input_contents.append(crops.data if ref is None else b"")
    if ref is not None:
        tensor.parameters[ASK].string_param = ref.text()
    with grpc.insecure_channel(supervisor.address("inference-a")) as channel:
        try:
            return v2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
        except grpc.RpcError as exc:
            return exc


def test_inference_reads_a_gateways_inputs_from_its_slab(
    slab_system: Supervisor, root: Path
) -> None:
    crops = process(slab_system, 3, None)
    plain = infer_direct(slab_system, crops, None, "another-host/1")
    assert isinstance(plain, v2.ModelInferResponse)
    assert plain.parameters[ASK].bool_param is False  # not of its domain: bytes stay
    slab = Slab(root, "gateway", 1 << 20, 1, 30.0)
    try:
        placed = infer_direct(slab_system, crops, slab, domain(root))
        assert isinstance(placed, v2.ModelInferResponse), placed
        assert placed.parameters[ASK].bool_param is True
        assert list(placed.raw_output_contents) == list(plain.raw_output_contents)
    finally:
        slab.close()
    unlinked = Slab(root, "gateway", 1 << 20, 1, 30.0)
    unlinked.close()  # its name gone, as if this host's /dev/shm were not inference's
    gone = infer_direct(slab_system, crops, unlinked, domain(root))
    assert isinstance(gone, grpc.RpcError) and gone.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot open shared memory slab" in (gone.details() or "")


def test_concurrent_photos_cut_into_parts_by_ref_answer_as_each_alone(
    tmp_path: Path, root: Path
) -> None:
    """Two replicas, every photo of a flight a part of its own: the flight's photos are placed
    in the gateway's slab once and each part names its own photo's bytes there."""
    config = image_config(DEFAULT_CONFIG, tmp_path, OBJECTIVE_MS, preprocess=(2, 1))
    raw = yaml.safe_load(config.read_text())
    raw["server"]["slab"] = {"enabled": True, "root": str(root), "size_mib": 8}
    raw["gateway"]["split_flight_bytes"] = 16384
    config.write_text(yaml.safe_dump(raw))
    run = tmp_path / "run"
    run.mkdir()
    photos = [PHOTOS[i % len(PHOTOS)] for i in range(24)]
    with (
        running(config, run) as (supervisor, _),
        grpc.insecure_channel(supervisor.address("gateway")) as channel,
    ):
        stub = v2_grpc.GRPCInferenceServiceStub(channel)

        def answer(photo: bytes) -> dict[str, np.ndarray]:
            request = codec.build_request(PIPELINE, {"image": np.array([photo], object)})
            return codec.response_outputs(stub.ModelInfer(request, timeout=60))

        alone = [answer(photo) for photo in photos[:3]]
        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(answer, photos))
    for i, got in enumerate(together):
        for name, expected in alone[i % 3].items():
            np.testing.assert_array_equal(expected, got[name])
