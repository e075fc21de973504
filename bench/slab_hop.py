"""A hop's cost with and without the shared-memory slab, A/B against the same processes:
`python -m bench.slab_hop [--photos 16] [--photo 256x256] [--rounds 8]`.

A preprocess and an inference process (bench.image_chain's `images` pipeline and stand-in
model, server.slab on, one host) are called as the gateway's hops call them, 4 calls in flight
on one grpc.aio channel each: preprocess with `--photos` small JPEGs a call (each a whole
224x224 UINT8 crop out, 147 KiB, at little decoding cost), inference with those crops. Rounds
alternate between bytes in the messages and the slab (services/gateway/upstream/slabs.py: the
photos written into this process's slab and the crops read out of preprocess's; the model
inputs written into this process's own), so
that both meet the same machine; the medians of CPU ms a photo, for the caller (this process,
as the gateway) and for the layer, are printed per hop and mode. A direction, not a
benchmark: run it on a quiet machine for figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import yaml

from bench.image_chain import MODEL, image_config, photo_size
from bench.images import PIPELINE, photo_jpeg
from bench.peers.cpu import cpu_seconds
from services.gateway.upstream.slabs import InferenceSlabs, ProcessSlabs
from strata.config import Settings, load_settings
from strata.process.allocator import keep_tensor_memory
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import ROOT, Supervisor
from strata.wire import codec
from strata.wire.slab import Slab

IN_FLIGHT = 4
MESSAGE_BYTES = 64 << 20
OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MESSAGE_BYTES),
]
Call = Callable[[bool], Awaitable[None]]  # one call, through the slab or not


def _preprocess(
    channel: grpc.aio.Channel, settings: Settings, images: np.ndarray, slab: Slab
) -> Call:
    item = v1.Request(id="b", pipeline=PIPELINE, tensors=codec.arrays_to_tensors({"image": images}))
    stub = preprocess_pb2_grpc.PreprocessStub(channel)
    slabs = ProcessSlabs("preprocess", settings.server.slab, slab)

    async def call(through: bool) -> None:
        request = v1.ProcessRequest(requests=[item])
        if not through:
            reply = await stub.Process(request, timeout=60)
        else:
            with slabs.carrying(request):
                reply = slabs.answered(await stub.Process(request, timeout=60))
            assert slabs.shares, "preprocess did not say it reads this process's slab"
        assert reply.results[0].tensors[0].data, reply.results[0]

    return call


def _inference(channel: grpc.aio.Channel, crops: v1.Tensor, slab: Slab) -> Call:
    stub = v2_grpc.GRPCInferenceServiceStub(channel)
    slabs = InferenceSlabs(slab)

    async def call(through: bool) -> None:
        request = v2.ModelInferRequest(model_name=MODEL, model_version="1")
        request.inputs.add(name=crops.name, datatype=crops.datatype, shape=crops.shape)
        request.raw_input_contents.append(crops.data)
        if not through:
            await stub.ModelInfer(request, timeout=60)
            return
        with slabs.carrying(request):
            slabs.answered(await stub.ModelInfer(request, timeout=60))
        assert slabs.shares, "inference did not say it reads this process's slab"

    return call


async def _ab(call: Call, pid: int, photos: int, rounds: int, calls: int) -> dict[str, list[float]]:
    """CPU ms a photo of this process and of `pid`, each round, by mode."""
    for slab in (False, True, True):  # warm: connections, mappings, and the slab learnt
        await asyncio.gather(*(call(slab) for _ in range(IN_FLIGHT)))
    figures: dict[str, list[float]] = {}
    for _ in range(rounds):
        for mode in ("bytes", "slab"):
            mine, theirs = time.process_time(), cpu_seconds(pid) or 0.0
            for _ in range(calls // IN_FLIGHT):
                await asyncio.gather(*(call(mode == "slab") for _ in range(IN_FLIGHT)))
            done = calls * photos / 1000
            figures.setdefault(f"{mode} caller", []).append((time.process_time() - mine) / done)
            spent = (cpu_seconds(pid) or 0.0) - theirs
            figures.setdefault(f"{mode} layer", []).append(spent / done)
    return figures


async def _measure(supervisor: Supervisor, settings: Settings, args: argparse.Namespace) -> None:
    pids = {name: supervisor.processes[name].pid for name in ("preprocess", "inference-a")}
    slab = Slab(settings.server.slab.root, "bench", 32 << 20, 1, 30.0)
    try:
        async with (
            grpc.aio.insecure_channel(supervisor.address("preprocess"), options=OPTIONS) as pre,
            grpc.aio.insecure_channel(supervisor.address("inference-a"), options=OPTIONS) as inf,
        ):
            images = np.array([photo_jpeg(*args.photo)] * args.photos, dtype=object)
            item = v1.Request(pipeline=PIPELINE, tensors=codec.arrays_to_tensors({"image": images}))
            reply = await preprocess_pb2_grpc.PreprocessStub(pre).Process(
                v1.ProcessRequest(requests=[item]), timeout=60
            )
            hops = {
                "preprocess": _preprocess(pre, settings, images, slab),
                "inference-a": _inference(inf, reply.results[0].tensors[0], slab),
            }
            print(
                f"CPU ms a photo, median of {args.rounds} rounds of {args.calls} calls of "
                f"{args.photos} photos:"
            )
            for hop, call in hops.items():
                figures = await _ab(call, pids[hop], args.photos, args.rounds, args.calls)
                shown = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in figures.items())
                print(f"  {hop}: {shown}", flush=True)
    finally:
        slab.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.slab_hop", description=__doc__)
    parser.add_argument("--photos", type=int, default=16, help="photos a call")
    parser.add_argument(
        "--photo",
        type=photo_size,
        default=(256, 256),
        help="WIDTHxHEIGHT of the JPEGs: small ones decode cheaply, so that the layer's figure "
        "shows the hop; 640x480 for the photos' own size (150 KB)",
    )
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each mode")
    parser.add_argument("--calls", type=int, default=40, help="calls a round")
    args = parser.parse_args()
    keep_tensor_memory()  # as the gateway does: else the caller pays for fresh pages
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        shm = stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm"))
        config = image_config(ROOT / "configs" / "default.yaml", tmp)
        raw = yaml.safe_load(config.read_text())
        raw["services"]["preprocess"]["replicas"] = 1
        raw["server"]["max_message_bytes"] = MESSAGE_BYTES
        raw["server"]["slab"] = {"enabled": True, "root": shm, "size_mib": 32}
        config.write_text(yaml.safe_dump(raw))
        settings = load_settings(config)
        supervisor = Supervisor(config, settings, log_dir=tmp)
        stack.callback(supervisor.stop_all)
        for name in ("preprocess", "inference-a"):
            supervisor.start(name)
        asyncio.run(_measure(supervisor, settings, args))


if __name__ == "__main__":
    main()
