"""KServe v2 metadata and Triton model-config messages, from (name, datatype, shape) lists.

The gateway describes pipelines and the inference service describes models the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import model_config_pb2 as mc
from strata.wire.triton_sequences import ModelSequence, PipelineSequence


class Tensor(Protocol):
    """Anything that names a tensor: a pipeline's TensorSpec, a model's graph input."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(self) -> str: ...

    @property
    def shape(self) -> Sequence[int]: ...


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


# protoc's .pyi types an enum's values as the enum, but its Value() as a plain int.


def config_type(datatype: str) -> mc.DataType:
    """Triton's DataType enum value for a v2 datatype name (BYTES is TYPE_STRING)."""
    name = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    return cast(mc.DataType, mc.DataType.Value(name))


def model_config(
    name: str,
    platform: str,
    max_batch_size: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    sequence: ModelSequence | PipelineSequence | None = None,
    *,
    decoupled: bool = False,
) -> v2.ModelConfigResponse:
    """Triton's convention: with max_batch_size > 0, dims leave out the batch dimension. An
    input with a `format` (NHWC, NCHW) says it as FORMAT_NHWC or FORMAT_NCHW. A stateful
    model or pipeline (`sequence`) is described by its sequence batching, a model's control
    inputs and states there and not among its inputs and outputs (as Triton's). A
    `decoupled` pipeline says so in its transaction policy, each output's dims those of one
    response."""
    drop = 1 if max_batch_size > 0 else 0
    fed, kept = (sequence.fed, sequence.kept) if isinstance(sequence, ModelSequence) else ((), ())
    batching = _sequence_batching(sequence, inputs, drop)
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
            if t.name not in fed
        ],
        output=[
            mc.ModelOutput(
                name=t.name, data_type=config_type(t.datatype), dims=list(t.shape)[drop:]
            )
            for t in outputs
            if t.name not in kept
        ],
    )
    if batching is not None:
        config.sequence_batching.CopyFrom(batching)
    if decoupled:
        config.model_transaction_policy.decoupled = True
    return v2.ModelConfigResponse(config=config)


def _sequence_batching(
    sequence: ModelSequence | PipelineSequence | None, inputs: Sequence[Tensor], drop: int
) -> mc.ModelSequenceBatching | None:
    """Triton's sequence batching, direct strategy: the idle timeout, and a model's
    control inputs (true as 1, false as 0) and implicit states."""
    if sequence is None:
        return None
    batching = mc.ModelSequenceBatching(
        direct=mc.ModelSequenceBatching.StrategyDirect(),
        max_sequence_idle_microseconds=sequence.max_sequence_idle_microseconds,
    )
    if isinstance(sequence, PipelineSequence):
        return batching
    types = {t.name: t for t in inputs}
    for kind, name in sequence.control.named().items():
        batching.control_input.add(name=name, control=[_control(kind, types[name].datatype)])
    for state in sequence.state:
        given = types[state.input]
        batching.state.add(
            input_name=state.input,
            output_name=state.output,
            data_type=config_type(given.datatype),
            dims=list(given.shape)[drop:],
        )
    return batching


def _control(kind: str, datatype: str) -> mc.ModelSequenceBatching.Control:
    kinds = mc.ModelSequenceBatching.Control.Kind
    value = cast(mc.ModelSequenceBatching.Control.Kind, kinds.Value(f"CONTROL_SEQUENCE_{kind}"))
    control = mc.ModelSequenceBatching.Control(kind=value)
    if kind == "CORRID":
        control.data_type = config_type(datatype)
    elif datatype == "BOOL":
        control.bool_false_true.extend([False, True])
    elif datatype == "INT32":
        control.int32_false_true.extend([0, 1])
    else:
        control.fp32_false_true.extend([0.0, 1.0])
    return control


def _format(tensor: Tensor) -> mc.ModelInput.Format:
    """Triton's Format enum value of a tensor's layout (FORMAT_NONE for none)."""
    layout = getattr(tensor, "format", None)  # only a pipeline's inputs may have one
    return cast(mc.ModelInput.Format, mc.ModelInput.Format.Value(f"FORMAT_{layout or 'NONE'}"))
