"""A request's tensors reuse memory: the preprocess process serving 640x480 JPEGs through
decode, resize and crop (a 150 KB UINT8 crop out each; normalise and CHW are folded into the
model) faults in next to no fresh pages once warm. With glibc's defaults it faulted in 660 to
1,000 pages an image (1.5 to 2.7 ms of system time); strata.process.allocator's thresholds bring
that to about 5."""

from __future__ import annotations

from pathlib import Path

import grpc

from bench.images import PIPELINE, batch_of, photo_jpeg, preprocess_process
from strata.proto.v1 import preprocess_pb2_grpc, tensor_pb2
from strata.wire import codec

WARM_UP = 10
IMAGES = 40
MAX_FAULTS_PER_IMAGE = 100


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (/proc/PID/stat, field 10)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[7])


def test_image_requests_fault_in_next_to_no_fresh_pages(tmp_path: Path) -> None:
    image = batch_of(photo_jpeg(), 1)
    request = tensor_pb2.ProcessRequest(
        requests=[
            tensor_pb2.Request(
                id="1", pipeline=PIPELINE, tensors=codec.arrays_to_tensors({"image": image})
            )
        ]
    )
    with preprocess_process(tmp_path) as (supervisor, address):
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        with grpc.insecure_channel(address, options=options) as channel:
            stub = preprocess_pb2_grpc.PreprocessStub(channel)
            for _ in range(WARM_UP):
                stub.Process(request, timeout=30)
            pid = supervisor.processes["preprocess"].pid
            before = minor_faults(pid)
            for _ in range(IMAGES):
                reply = stub.Process(request, timeout=30)
            faults = (minor_faults(pid) - before) / IMAGES
    assert list(reply.results[0].tensors[0].shape) == [1, 224, 224, 3]
    assert faults < MAX_FAULTS_PER_IMAGE, f"{faults:.0f} minor page faults an image"
