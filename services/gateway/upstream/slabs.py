"""A strata.v1 hop's big tensors through shared memory (strata.wire.slab), where the layer
behind it shares this host's /dev/shm.

Each call asks for slabs with this process's domain; a layer on the same host and file system
answers its big tensors as refs into its slab, any other answers bytes. The refs are read here,
as the answer arrives (one copy, and the blocks released), so that everything after the hop
sees bytes, as before. A ref this process cannot open (the folder is not the sender's, or its
permissions differ) fails that call with UNAVAILABLE, saying so, and the hop asks no more:
from then on the layer answers bytes.
"""

from __future__ import annotations

import logging

from strata.errors import Unavailable
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.slab import ASK, Ref, SlabConfig, SlabLost, Slabs, domain

log = logging.getLogger(__name__)


class HopSlabs:
    """The slabs a hop's answers may name, and whether the hop still asks for them."""

    def __init__(self, hop: str, settings: SlabConfig) -> None:
        self._hop = hop
        self._slabs = Slabs(settings.root)
        self._domain = domain(settings.root)
        self.asking = True

    def ask(self, request: v1.ProcessRequest) -> None:
        """Ask for slabs in each of the call's requests, while the hop may."""
        for item in request.requests:
            if self.asking:
                item.parameters[ASK] = self._domain
            elif ASK in item.parameters:  # a retry of a call that asked
                del item.parameters[ASK]

    def read(self, reply: v1.ProcessResponse) -> None:
        """Each tensor of `reply` that names a slab, given its bytes in place."""
        for result in reply.results:
            for tensor in result.tensors:
                if tensor.slab:
                    self._read(tensor)

    def _read(self, tensor: v1.Tensor) -> None:
        what = f"{self._hop}'s tensor {tensor.name!r}"
        try:
            ref = Ref.parse(tensor.slab)
            tensor.data = self._slabs.read(ref, what)
        except ValueError:
            raise Unavailable(f"{what}: malformed shared memory ref") from None
        except SlabLost:
            raise
        except Unavailable:
            self.asking = False
            log.warning("%s: slabs unreadable here, asking for bytes from now on", self._hop)
            raise
        tensor.ClearField("slab")
