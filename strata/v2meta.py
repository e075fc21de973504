"""KServe v2 metadata and Triton model-config messages, from (name, datatype, shape) lists.

The gateway describes pipelines and the inference service describes models the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import model_config_pb2 as mc


class Tensor(Protocol):
    """Anything that names a tensor: a pipeline's TensorSpec, a model's graph input."""

    name: str
    datatype: str
    shape: Sequence[int]


def metadata_response(
    name: str,
    versions: Sequence[str],
    platform: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
) -> v2.ModelMetadataResponse:
    def meta(t: Tensor) -> v2.ModelMetadataResponse.TensorMetadata:
        return v2.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=t.datatype, shape=list(t.shape)
        )

    return v2.ModelMetadataResponse(
        name=name,
        versions=list(versions),
        platform=platform,
        inputs=[meta(t) for t in inputs],
        outputs=[meta(t) for t in outputs],
    )


def config_type(datatype: str) -> int:
    """Triton's DataType enum value for a v2 datatype name (BYTES is TYPE_STRING)."""
    return mc.DataType.Value("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")


def model_config(
    name: str,
    platform: str,
    max_batch_size: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
) -> v2.ModelConfigResponse:
    """Triton's convention: with max_batch_size > 0, dims leave out the batch dimension. An
    input with a `format` (NHWC, NCHW) says it as FORMAT_NHWC or FORMAT_NCHW."""
    drop = 1 if max_batch_size > 0 else 0
    config = mc.ModelConfig(
        name=name,
        platform=platform,
        max_batch_size=max_batch_size,
        input=[
            mc.ModelInput(
                name=t.name,
                data_type=config_type(t.datatype),
                format=_format(t),
                dims=list(t.shape)[drop:],
            )
            for t in inputs
        ],
        output=[
            mc.ModelOutput(
                name=t.name, data_type=config_type(t.datatype), dims=list(t.shape)[drop:]
            )
            for t in outputs
        ],
    )
    return v2.ModelConfigResponse(config=config)


def _format(tensor: Tensor) -> int:
    """Triton's Format enum value of a tensor's layout (FORMAT_NONE for none)."""
    layout = getattr(tensor, "format", None)  # only a pipeline's inputs may have one
    return mc.ModelInput.Format.Value(f"FORMAT_{layout or 'NONE'}")
