"""An inference's answer as the v2 response: its outputs in the message, or described where
the client had them written into shared memory, and the gateway's strata.* parameters."""

from __future__ import annotations

from services.gateway.request import Answer
from services.gateway.serving.shared_memory import REGION, SIZE, Placement
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec


def response(
    request: v2.ModelInferRequest,
    answer: Answer,
    outputs: codec.Arrays,
    placed: dict[str, Placement],
) -> v2.ModelInferResponse:
    """The answer; an output written into shared memory (`placed`) is described with its
    region and byte size and no data (an empty raw entry keeps the others' places, as
    tritonclient reads them)."""
    # The version that answered, as strata.model_version says ("" for a default answer).
    message = v2.ModelInferResponse(
        model_name=request.model_name, model_version=answer.model_version, id=request.id
    )
    _parameters(message, answer)
    for name, array in outputs.items():
        place = placed.get(name)
        if place is None:
            codec.add_outputs(message, {name: array})
            continue
        datatype = codec.datatype_of(array)
        tensor = message.outputs.add(name=name, datatype=datatype, shape=array.shape)
        tensor.parameters[REGION].string_param = place.region
        tensor.parameters[SIZE].int64_param = place.size
        message.raw_output_contents.append(b"")
    return message


def _parameters(message: v2.ModelInferResponse, answer: Answer) -> None:
    """How the answer was made: its arm, version and level, and whether it is degraded,
    cached, partial (rules skipped) or several models'."""
    parameters = message.parameters
    parameters["strata.arm"].string_param = answer.arm
    parameters["strata.model_version"].string_param = answer.model_version
    parameters["strata.level"].int64_param = answer.level
    parameters["strata.degraded"].bool_param = bool(answer.degraded)
    if answer.degraded:
        parameters["strata.degraded_source"].string_param = answer.degraded
    if answer.cached:
        parameters["strata.cached"].bool_param = True
    if answer.skipped_rules:
        parameters["strata.skipped_rules"].string_param = answer.skipped_rules
    if answer.stages:
        parameters["strata.stages"].string_param = answer.stages
