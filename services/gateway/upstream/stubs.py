"""The generated stubs' methods the gateway calls upstream, typed: grpcio-tools writes no .pyi
for the *_pb2_grpc modules, so their stub classes are untyped and these Protocols say what an
instance holds."""

from __future__ import annotations

from typing import Protocol

from grpc.aio import StreamStreamMultiCallable, UnaryUnaryMultiCallable

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1


class ProcessStub(Protocol):
    """strata.v1 Preprocess's or Postprocess's stub."""

    Process: UnaryUnaryMultiCallable[v1.ProcessRequest, v1.ProcessResponse]
    ProcessStream: StreamStreamMultiCallable[v1.ProcessRequest, v1.ProcessResponse]


class InferenceStub(Protocol):
    """inference.GRPCInferenceService's stub: the calls of a flight and the gateway's own
    questions (the repository API's calls go by name, api/repository.py)."""

    ModelInfer: UnaryUnaryMultiCallable[v2.ModelInferRequest, v2.ModelInferResponse]
    ModelStreamInfer: StreamStreamMultiCallable[v2.ModelInferRequest, v2.ModelStreamInferResponse]
    ModelReady: UnaryUnaryMultiCallable[v2.ModelReadyRequest, v2.ModelReadyResponse]
    ModelConfig: UnaryUnaryMultiCallable[v2.ModelConfigRequest, v2.ModelConfigResponse]
