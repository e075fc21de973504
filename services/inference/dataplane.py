"""The inference data plane: a v2 ModelInfer request, alone or a flight, run on the model
version that serves it.

A flight (strata.wire.flight) is several client requests stacked along the first dimension: each
member is queued as a request of its own, with its own deadline and trace, so the batcher may
batch it with others and one member's failure is its own; the answered members' outputs come
back stacked in order and the others' errors in the response's parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from itertools import accumulate

import numpy as np

from services.inference import spans
from services.inference.jobs import Request
from services.inference.manager import ModelManager
from services.inference.model import ModelVersion
from services.inference.params import request_options
from services.inference.sequences import Sequences, refuse_stateless
from services.inference.slabs import SlabInputs
from strata.errors import NotReady, StrataError, Unavailable
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec, flight
from strata.wire.deadline import Deadline, earliest
from strata.wire.triton_sequences import Flags, sequence_flags


class DataPlane:
    """Runs ModelInfer requests over the model manager."""

    def __init__(
        self, models: ModelManager, configured: list[str], slabs: SlabInputs | None = None
    ) -> None:
        """`slabs`: inputs a gateway of this host sent through shared memory, where on."""
        self._models = models
        self._configured = configured
        self._sequences = Sequences(self._serving)
        self._slabs = slabs

    async def infer(
        self, request: v2.ModelInferRequest, call: Deadline | None
    ) -> v2.ModelInferResponse:
        """The answer to one ModelInfer request, a flight's or a lone one; `call`: the call's
        deadline (None for none)."""
        response = await self._infer(request, call)
        if self._slabs is not None:
            self._slabs.tell(request, response)
        return response

    def _inputs(self, request: v2.ModelInferRequest) -> codec.Arrays:
        if self._slabs is None:
            return codec.request_inputs(request)
        return self._slabs.inputs(request)

    async def _infer(
        self, request: v2.ModelInferRequest, call: Deadline | None
    ) -> v2.ModelInferResponse:
        flags = sequence_flags(request.parameters)
        if flags is not None:
            return await self._sequence_step(request, flags, call)
        model = self._serving(request.model_name, request.model_version)
        refuse_stateless(model)
        wanted = codec.requested_outputs(request, model.signature.output_names)
        arrays = self._inputs(request)
        options = request_options(request.parameters, call)
        if flight.is_flight(request.parameters):
            return await self._flight(model, request, arrays, options, wanted)
        outputs = await model.infer(arrays, options)
        return _response(model, request.id, {name: outputs[name] for name in wanted})

    async def _sequence_step(
        self, request: v2.ModelInferRequest, flags: Flags, call: Deadline | None
    ) -> v2.ModelInferResponse:
        """One request of a sequence (services/inference/sequences.py)."""
        arrays = self._inputs(request)
        options = request_options(request.parameters, call)
        name, version = request.model_name, request.model_version
        model, outputs = await self._sequences.infer(name, version, flags, arrays, options)
        wanted = codec.requested_outputs(request, list(outputs))
        return _response(model, request.id, {name: outputs[name] for name in wanted})

    def _serving(self, name: str, version: str) -> ModelVersion:
        """The version that runs a request; UNAVAILABLE for a configured model that is not
        loaded here now (unloaded, or its load failed): another replica or arm may have it."""
        try:
            return self._models.resolve(name, version)
        except NotReady as exc:
            if name not in self._configured:
                raise
            raise Unavailable(f"{exc}; another replica may serve it") from None

    async def _flight(
        self,
        model: ModelVersion,
        request: v2.ModelInferRequest,
        arrays: codec.Arrays,
        options: Request,
        wanted: list[str],
    ) -> v2.ModelInferResponse:
        """A flight (strata.wire.flight): each member queued as a request of its own; the
        answered members' outputs stacked in order, the others' errors in the parameters."""
        first = next(iter(arrays.values()), None)
        total = first.shape[0] if first is not None and first.ndim else 0
        members = flight.members(request.parameters, total)
        if options.skip_batching:
            # The gateway's skip-batching level: the flight is a batch already, so it runs
            # as one, at once; only if that fails do its members run apart, to isolate one.
            with contextlib.suppress(StrataError):
                outputs = await model.infer(arrays, options)
                return _response(model, request.id, {name: outputs[name] for name in wanted})
        starts = [0, *accumulate(m.rows for m in members)]
        outcomes = await asyncio.gather(
            *(
                model.infer(
                    _rows(arrays, starts[i], starts[i + 1]),
                    _own(options, m),
                    spans.sampled(m.traceparent),  # its batch links to it
                )
                for i, m in enumerate(members)
            ),
            return_exceptions=True,
        )
        errors = {i: o for i, o in enumerate(outcomes) if isinstance(o, BaseException)}
        if len(errors) == len(members):
            raise errors[0]
        answered = [o for o in outcomes if not isinstance(o, BaseException)]
        outputs = {name: np.concatenate([o[name] for o in answered]) for name in wanted}
        response = _response(model, request.id, outputs)
        flight.set_errors(response.parameters, errors)
        return response


def _rows(arrays: codec.Arrays, start: int, end: int) -> codec.Arrays:
    return {name: array[start:end] for name, array in arrays.items()}


def _own(options: Request, member: flight.FlightMember) -> Request:
    """The call's options with the member's own deadline, where it is the sooner."""
    deadline = earliest(options.deadline, member.deadline)
    return options if deadline is options.deadline else replace(options, deadline=deadline)


def _response(model: ModelVersion, request_id: str, outputs: codec.Arrays) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(
        model_name=model.name, model_version=str(model.version), id=request_id
    )
    codec.add_outputs(response, outputs)
    return response
