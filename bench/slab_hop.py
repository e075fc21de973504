"""The preprocess hop's cost with and without the shared-memory slab, A/B against one process:
`python -m bench.slab_hop [--photos 16] [--rounds 6]`.

One preprocess process (bench.images' `images` pipeline, server.slab on) answers Process calls
of `--photos` small JPEGs (each a whole 224x224 UINT8 crop out, 147 KiB, at little decoding
cost), 4 in flight from one grpc.aio channel, as the gateway's hop sends them. Rounds
alternate between calls that ask for the slab (read back and released as the gateway's hop
does, services/gateway/upstream/slabs.py) and calls that do not (bytes), so that both meet the
same machine; the medians of CPU ms a photo, for the caller (this process) and for
preprocess, are printed per mode. A direction, not a benchmark: run it on a quiet machine for
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import yaml

from bench.image_chain import image_config
from bench.images import PIPELINE, photo_jpeg
from bench.peers.cpu import cpu_seconds
from services.gateway.upstream.slabs import HopSlabs
from strata.config import load_settings
from strata.config.server import SlabSettings
from strata.proto.v1 import preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import ROOT, Supervisor
from strata.wire import codec

IN_FLIGHT = 4
MESSAGE_BYTES = 64 << 20


async def _round(
    stub: preprocess_pb2_grpc.PreprocessStub,
    call: v1.ProcessRequest,
    slabs: HopSlabs | None,
    n: int,
) -> None:
    """`n` calls, IN_FLIGHT at once; each answer's slab refs read as the gateway reads them."""

    async def one() -> None:
        request = v1.ProcessRequest()
        request.CopyFrom(call)
        if slabs is not None:
            slabs.ask(request)
        reply = await stub.Process(request, timeout=60)
        if slabs is not None:
            slabs.read(reply)
        assert reply.results[0].tensors[0].data, reply.results[0]

    for _ in range(n // IN_FLIGHT):
        await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))


async def _measure(
    address: str, pid: int, slab: SlabSettings, photos: int, rounds: int, calls: int
) -> None:
    images = np.array([photo_jpeg(256, 256)] * photos, dtype=object)
    item = v1.Request(id="b", pipeline=PIPELINE, tensors=codec.arrays_to_tensors({"image": images}))
    call = v1.ProcessRequest(requests=[item])
    options = [
        ("grpc.max_send_message_length", MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MESSAGE_BYTES),
    ]
    per_photo: dict[str, dict[str, list[float]]] = {
        mode: {"caller": [], "preprocess": []} for mode in ("bytes", "slab")
    }
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = preprocess_pb2_grpc.PreprocessStub(channel)
        slabs = HopSlabs("preprocess", slab)
        await _round(stub, call, slabs, IN_FLIGHT * 4)  # warm: connection, mapping, pools
        await _round(stub, call, None, IN_FLIGHT * 4)
        for _ in range(rounds):
            for mode, using in (("bytes", None), ("slab", slabs)):
                mine, theirs = time.process_time(), cpu_seconds(pid) or 0.0
                await _round(stub, call, using, calls)
                done = calls * photos / 1000
                per_photo[mode]["caller"].append((time.process_time() - mine) / done)
                spent = (cpu_seconds(pid) or 0.0) - theirs
                per_photo[mode]["preprocess"].append(spent / done)
    print(f"CPU ms a photo, median of {rounds} rounds of {calls} calls of {photos} photos:")
    for mode, sides in per_photo.items():
        shown = ", ".join(f"{side} {statistics.median(v):.3f}" for side, v in sides.items())
        print(f"  {mode}: {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.slab_hop", description=__doc__)
    parser.add_argument("--photos", type=int, default=16, help="photos a call")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each mode")
    parser.add_argument("--calls", type=int, default=40, help="calls a round")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="strata-") as tmp,
        tempfile.TemporaryDirectory(dir="/dev/shm") as shm,
    ):
        config = image_config(ROOT / "configs" / "default.yaml", Path(tmp))
        raw = yaml.safe_load(config.read_text())
        raw["services"]["preprocess"]["replicas"] = 1
        raw["server"]["max_message_bytes"] = MESSAGE_BYTES
        raw["server"]["slab"] = {"enabled": True, "root": shm, "size_mib": 32}
        config.write_text(yaml.safe_dump(raw))
        settings = load_settings(config)
        supervisor = Supervisor(config, settings, log_dir=Path(tmp))
        pid = supervisor.start("preprocess").pid
        try:
            asyncio.run(
                _measure(
                    supervisor.address("preprocess"),
                    pid,
                    settings.server.slab,
                    args.photos,
                    args.rounds,
                    args.calls,
                )
            )
        finally:
            supervisor.stop_all()


if __name__ == "__main__":
    main()
