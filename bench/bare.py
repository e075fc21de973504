"""The floor: one process, grpc.aio and ONNX Runtime, no batching, no hops.

`python -m bench.bare --model build/repository/digits/1/model.onnx --name digits --listen
127.0.0.1:8501` serves one ONNX file as a KServe v2 model: each ModelInfer runs the model at
once on the event loop's thread and answers. Nothing else — no validation beyond decoding, no
queue, no metrics — so it is what one v2 request costs in Python gRPC plus the model, the
figure the peer benchmark (bench/peers) holds every server against.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

import grpc
import onnxruntime

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec


def session(path: Path) -> onnxruntime.InferenceSession:
    """One CPU session, one thread: the same footing as one inference worker."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class Bare(v2_grpc.GRPCInferenceServiceServicer):
    """ModelInfer for one model, and the liveness calls a client waits on."""

    def __init__(self, name: str, model: onnxruntime.InferenceSession) -> None:
        self._name = name
        self._session = model
        self._outputs = [o.name for o in model.get_outputs()]

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context) -> v2.ModelReadyResponse:
        return v2.ModelReadyResponse(ready=request.name == self._name)

    async def ModelInfer(self, request, context) -> v2.ModelInferResponse:
        if request.model_name != self._name:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {request.model_name!r}")
        results = self._session.run(self._outputs, codec.request_inputs(request))
        response = v2.ModelInferResponse(model_name=self._name, id=request.id)
        codec.add_outputs(response, dict(zip(self._outputs, results, strict=True)))
        return response


async def serve(model: Path, name: str, listen: str) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # a port in use fails
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(Bare(name, session(model)), server)
    server.add_insecure_port(listen)
    await server.start()
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bare", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="the ONNX file")
    parser.add_argument("--name", default="digits", help="the model name clients ask for")
    parser.add_argument("--listen", default="127.0.0.1:8501")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.model, args.name, args.listen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
