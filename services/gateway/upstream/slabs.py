"""A hop's big tensors through shared memory (strata.wire.slab), where the layer behind it
shares this host's /dev/shm (its `domain`: the same boot, the same file system under root).

- Preprocess (strata.v1): each call asks for slabs with this process's domain; a preprocess
  of that domain answers its big tensors (crops) as refs into its own slab, any other answers
  bytes. The refs are read as the answer arrives (one copy) and released, so that everything
  after the hop sees bytes, as before. A ref this process cannot open (the folder is not the
  sender's, or its permissions differ) fails that call with UNAVAILABLE, saying so, and the hop
  asks no more: from then on the layer answers bytes. The other way, once a preprocess said
  in its answer (info `strata.slab`) that it reads this process's slab, a call's big tensors
  (the clients' encoded photos) go through this process's slab as inference's inputs do, each
  naming its block; the blocks are freed when the call ends.
- Inference (v2): each request names this process's domain (parameter `strata.slab`); a
  Strata inference of that domain says so in its answer. From then on the hop writes a
  request's big raw inputs into this process's slab, each input naming its block in the same
  parameter and its raw contents left empty; the blocks are freed when the call ends, answered
  or not (a receiver still reading then is refused by the slab's guard, never given others'
  bytes). A slab full or a small input: bytes, as before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

import numpy as np

from strata.errors import StrataError, Unavailable
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.slab import (
    ASK,
    READS,
    SHARED_MEMORY,
    Ref,
    Slab,
    SlabConfig,
    SlabLost,
    Slabs,
    domain,
)

log = logging.getLogger(__name__)
Request = TypeVar("Request", contravariant=True)
Reply = TypeVar("Reply")


class HopSlabs(Protocol[Request, Reply]):
    """What a hop does with slabs around a call: carry the request (and undo what it placed
    once the call ended), and take the reply."""

    def carrying(self, request: Request) -> contextlib.AbstractContextManager[None]: ...

    def answered(self, reply: Reply) -> Reply: ...


class ProcessSlabs:
    """The preprocess hop's: its answers' crops come through preprocess's slab, and its
    requests' big tensors through this process's `slab` (where it has one) once preprocess
    said it reads it."""

    def __init__(self, hop: str, settings: SlabConfig, slab: Slab | None = None) -> None:
        self._hop = hop
        self._slabs = Slabs(settings.root)
        self._domain = domain(settings.root)
        self._slab = slab
        self.asking = True
        self.shares = False
        self.placing = True

    @contextlib.contextmanager
    def carrying(self, request: v1.ProcessRequest) -> Iterator[None]:
        """Ask for slabs in each of the call's requests, while the hop may; place their big
        tensors in this process's slab while preprocess reads it, for the call's length."""
        placed: list[Ref] = []
        for item in request.requests:
            if self.asking:
                item.parameters[ASK] = self._domain
            elif ASK in item.parameters:  # a part of a call that asked
                del item.parameters[ASK]
            if self.shares and self._slab is not None:
                placed += _placed(self._slab, item.tensors)
        with _lent(self, self._slab, placed):
            yield

    def answered(self, reply: v1.ProcessResponse) -> v1.ProcessResponse:
        """`reply` with each tensor that names a slab given its bytes in place; whether
        preprocess reads this process's slab, learnt from it."""
        self.shares = self.placing and any(r.info.get(ASK) == READS for r in reply.results)
        for result in reply.results:
            for tensor in result.tensors:
                if tensor.slab:
                    self._read(tensor)
        return reply

    def _read(self, tensor: v1.Tensor) -> None:
        what = f"{self._hop}'s tensor {tensor.name!r}"
        ref = Ref.named(tensor.slab, what)
        try:
            tensor.data = self._slabs.read(ref, what)
        except SlabLost:
            raise
        except Unavailable:
            self.asking = False
            log.warning("%s: slabs unreadable here, asking for bytes from now on", self._hop)
            raise
        tensor.ClearField("slab")


class _Sharing(Protocol):
    shares: bool  # whether the layer said it reads this process's slab
    placing: bool  # False once a layer could not read it: bytes from then on


@contextlib.contextmanager
def _lent(hop: _Sharing, slab: Slab | None, placed: list[Ref]) -> Iterator[None]:
    """For a call's length, the blocks it `placed` in `slab`: freed when it ends. Where it
    failed with some placed, `hop` learns again whether the layer reads them; where the
    layer said it could not read them (its error names the shared memory: a folder or
    permissions not this process's, though the domain is), `hop` places nothing more, so
    that a set-up that cannot work fails one call, not every other one."""
    try:
        yield
    except BaseException as exc:
        if placed:
            hop.shares = False
            if isinstance(exc, StrataError) and SHARED_MEMORY in str(exc):
                hop.placing = False
                log.warning("%s: sending bytes from now on", exc)
        raise
    finally:
        if slab is not None:
            for ref in placed:
                slab.free(ref)


def _placed(slab: Slab, tensors: Iterable[v1.Tensor]) -> list[Ref]:
    """Each of `tensors` the slab takes (big enough, room for it) written there, its bytes
    replaced by its block's ref."""
    placed = []
    for tensor in tensors:
        ref = slab.place(np.frombuffer(tensor.data, np.uint8))
        if ref is not None:
            tensor.slab = ref.text()
            tensor.ClearField("data")
            placed.append(ref)
    return placed


class InferenceSlabs:
    """An inference hop's: its requests' big inputs go through this process's slab, once the
    deployment has said it reads it."""

    def __init__(self, slab: Slab) -> None:
        self._slab = slab
        self.shares = False
        self.placing = True

    @contextlib.contextmanager
    def carrying(self, request: v2.ModelInferRequest) -> Iterator[None]:
        request.parameters[ASK].string_param = self._slab.domain
        placed = self._place(request) if self.shares else []
        with _lent(self, self._slab, placed):
            yield

    def _place(self, request: v2.ModelInferRequest) -> list[Ref]:
        placed = []
        raw = request.raw_input_contents
        for i, data in enumerate(raw):
            ref = self._slab.place(np.frombuffer(data, np.uint8))
            if ref is not None:
                raw[i] = b""
                request.inputs[i].parameters[ASK].string_param = ref.text()
                placed.append(ref)
        return placed

    def answered(self, reply: v2.ModelInferResponse) -> v2.ModelInferResponse:
        """Learn from `reply` whether the deployment reads this process's slab."""
        self.shares = self.placing and ASK in reply.parameters and reply.parameters[ASK].bool_param
        return reply
