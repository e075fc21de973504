"""Model inputs a gateway of this host sent through its shared-memory slab (strata.wire.slab).

A request names its sender's `domain` in the parameter `strata.slab`; the answer says (the
same parameter, a bool) whether this process shares it, so that the gateway sends big inputs
through its slab from then on. An input sent so names its block in its own `strata.slab`
parameter, its raw contents empty; its bytes are copied out once, here. The gateway frees the
block when the call ends: a block that was taken again before it was read is refused
UNAVAILABLE (a server's fault, never the client's), as is a slab this process cannot open.
An input may name blocks of another process of the host (preprocess's crops, which the
gateway passes on), or several blocks that hold its rows in order: read alike, released by
the gateway.
"""

from __future__ import annotations

from strata.errors import shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec
from strata.wire.slab import ASK, Ref, SlabConfig, Slabs, domain


class SlabInputs:
    """Reads the inputs a request placed in its sender's slab."""

    def __init__(self, settings: SlabConfig) -> None:
        self._slabs = Slabs(settings.root)
        self._domain = domain(settings.root)

    def inputs(self, request: v2.ModelInferRequest) -> codec.Arrays:
        """The request's inputs decoded, those in a slab read from it."""
        raw = list(request.raw_input_contents)
        for i, tensor in enumerate(request.inputs):
            if ASK in tensor.parameters:
                raw[i] = self._read(tensor)
        return codec.request_inputs(request, raw)

    def _read(self, tensor: v2.ModelInferRequest.InferInputTensor) -> bytes:
        what = f"input {shown(tensor.name)}"
        refs = Ref.all_named(tensor.parameters[ASK].string_param, what)
        return self._slabs.gather(refs, what)

    def tell(self, request: v2.ModelInferRequest, response: v2.ModelInferResponse) -> None:
        """Say in `response` whether this process reads the slabs of the request's sender."""
        if ASK in request.parameters:
            asked = request.parameters[ASK].string_param
            response.parameters[ASK].bool_param = asked == self._domain
