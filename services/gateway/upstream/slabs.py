"""A hop's big tensors through shared memory (strata.wire.slab), where the layer behind it
shares this host's /dev/shm (its `domain`: the same boot, the same file system under root).

- Preprocess (strata.v1): each call asks for slabs with this process's domain; a preprocess
  of that domain answers its big tensors (crops) as refs into its own slab, any other answers
  bytes. The refs are not read here: they are checked as the answer arrives and passed on to
  inference (`Passed`), which reads them from preprocess's slab, so that a crop crosses the
  gateway without a copy (it made nine). Whatever else needs a crop's bytes (a stage, a
  shadow, a fallback, postprocess) reads them first; the flight releases the blocks when it is
  done. A ref this process cannot open (the folder is not the sender's, or its permissions
  differ) fails that call with UNAVAILABLE, saying so, and the hop asks no more: from then on
  the layer answers bytes. The other way, once a preprocess said
  in its answer (info `strata.slab`) that it reads this process's slab, a call's big tensors
  (the clients' encoded photos) go through this process's slab as inference's inputs do, each
  naming its block; the blocks are freed when the call ends.
- Inference (v2): each request names this process's domain (parameter `strata.slab`); a
  Strata inference of that domain says so in its answer. From then on the hop writes a
  request's big raw inputs into this process's slab, each input naming its block in the same
  parameter and its raw contents left empty; the blocks are freed when the call ends, answered
  or not (a receiver still reading then is refused by the slab's guard, never given others'
  bytes). A slab full or a small input: bytes, as before. Inputs that name preprocess's blocks
  go as they are to a deployment that reads this process's slab (the same domain), and are
  read into bytes for any other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from strata.errors import StrataError, Unavailable
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.slab import (
    ASK,
    READS,
    REFS,
    SHARED_MEMORY,
    Ref,
    Slab,
    Slabs,
    domain,
)
from strata.wire.stack import Raw

log = logging.getLogger(__name__)
Request = TypeVar("Request", contravariant=True)
Reply = TypeVar("Reply")


class HopSlabs(Protocol[Request, Reply]):
    """What a hop does with slabs around a call: carry the request (and undo what it placed
    once the call ended), and take the reply."""

    def carrying(self, request: Request) -> contextlib.AbstractContextManager[None]: ...

    def answered(self, reply: Reply) -> Reply: ...


class Passed:
    """Blocks of preprocess's slab that this process passes on by ref: their tensors name
    them (`slab`, `REFS` between several) instead of carrying bytes."""

    def __init__(self, root: Path) -> None:
        self._slabs = Slabs(root)
        self.domain = domain(root)

    def check(self, tensor: v1.Tensor, what: str) -> None:
        """Unavailable unless this process can read the blocks `tensor` names."""
        for ref in Ref.all_named(tensor.slab, what):
            self._slabs.check(ref, what)

    def read(self, tensors: list[v1.Tensor]) -> list[v1.Tensor]:
        """`tensors`, each that names blocks made again with their bytes (the blocks kept
        until `release`)."""
        return [self._bytes(t) if t.slab else t for t in tensors]

    def _bytes(self, tensor: v1.Tensor) -> v1.Tensor:
        what = f"preprocess's tensor {tensor.name!r}"
        data = self._slabs.gather(Ref.all_named(tensor.slab, what), what)
        return v1.Tensor(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape, data=data)

    def read_inputs(self, request: v2.ModelInferRequest) -> None:
        """Each input of `request` that names blocks given its bytes as raw contents."""
        for i, tensor in enumerate(request.inputs):
            if ASK in tensor.parameters:
                what = f"input {tensor.name!r}"
                refs = Ref.all_named(tensor.parameters[ASK].string_param, what)
                request.raw_input_contents[i] = self._slabs.gather(refs, what)
                del tensor.parameters[ASK]

    def release(self, tensors: Iterable[v1.Tensor]) -> None:
        """Give back the blocks `tensors` name, once nothing reads them any more."""
        for tensor in tensors:
            if tensor.slab:
                for text in tensor.slab.split(REFS):
                    with contextlib.suppress(ValueError):
                        self._slabs.release(Ref.parse(text))

    def dropped(self, reply: v1.ProcessResponse) -> None:
        """Give back the blocks a reply names that nothing will read."""
        for result in reply.results:
            self.release(result.tensors)


class ProcessSlabs:
    """The preprocess hop's: its answers' crops come through preprocess's slab (`passed` on),
    and its requests' big tensors through this process's `slab` (where it has one) once
    preprocess said it reads it."""

    def __init__(self, hop: str, passed: Passed, slab: Slab | None = None) -> None:
        self._hop = hop
        self.passed = passed
        self._domain = passed.domain
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

    def placed(self, tensor: v1.Tensor) -> Raw | None:
        """`tensor` in place in this process's slab, where `carrying` put it there (else
        None): a flight's photos, cut into parts by ref (upstream/split.py)."""
        if self._slab is None or not tensor.slab.startswith(f"{self._slab.key}:"):
            return None
        ref = Ref.parse(tensor.slab)
        shape = tuple(tensor.shape)
        return Raw(tensor.name, tensor.datatype, shape, self._slab.view(ref), ref)

    def answered(self, reply: v1.ProcessResponse) -> v1.ProcessResponse:
        """`reply`, each tensor that names blocks checked readable (they are passed on);
        whether preprocess reads this process's slab, learnt from it."""
        self.shares = self.placing and any(r.info.get(ASK) == READS for r in reply.results)
        try:
            for result in reply.results:
                for tensor in result.tensors:
                    if tensor.slab:
                        self.passed.check(tensor, f"{self._hop}'s tensor {tensor.name!r}")
        except Unavailable:
            self.passed.dropped(reply)
            self.asking = False
            log.warning("%s: slabs unreadable here, asking for bytes from now on", self._hop)
            raise
        return reply


class _Sharing(Protocol):
    shares: bool  # whether the layer said it reads this process's slab
    placing: bool  # False once a layer could not read it: bytes from then on


@contextlib.contextmanager
def _lent(
    hop: _Sharing, slab: Slab | None, placed: list[Ref], by_ref: bool = False
) -> Iterator[None]:
    """For a call's length, the blocks it `placed` in `slab`: freed when it ends. Where it
    failed with some placed (or passed on: `by_ref`), `hop` learns again whether the layer
    reads them; where the layer said it could not read them (its error names the shared
    memory: a folder or permissions not this process's, though the domain is), `hop` places
    nothing more, so that a set-up that cannot work fails one call, not every other one. A
    passed-on block the layer could not open (its error names a slab not this process's) is
    one whose owner went (a preprocess replica killed while its flight was at inference): that
    call fails, and the hop only learns again."""
    try:
        yield
    except BaseException as exc:
        if placed or by_ref:
            hop.shares = False
            said = str(exc) if isinstance(exc, StrataError) else ""
            passed = by_ref and (slab is None or slab.key not in said)
            if SHARED_MEMORY in said and not passed:
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
        if tensor.slab:  # placed already (the whole flight's, before it was cut)
            continue
        ref = slab.place(np.frombuffer(tensor.data, np.uint8))
        if ref is not None:
            tensor.slab = ref.text()
            tensor.ClearField("data")
            placed.append(ref)
    return placed


class InferenceSlabs:
    """An inference hop's: its requests' big inputs go through this process's `slab` (where
    it has one), and those that name `passed` blocks go as they are, once the deployment has
    said it reads this process's slabs."""

    def __init__(self, passed: Passed, slab: Slab | None = None) -> None:
        self._passed = passed
        self._slab = slab
        self.shares = False
        self.placing = True

    @contextlib.contextmanager
    def carrying(self, request: v2.ModelInferRequest) -> Iterator[None]:
        request.parameters[ASK].string_param = self._passed.domain
        by_ref = self.shares and any(ASK in tensor.parameters for tensor in request.inputs)
        if not self.shares:
            self._passed.read_inputs(request)
        placed = _placed_inputs(self._slab, request) if self.shares and self._slab else []
        with _lent(self, self._slab, placed, by_ref):
            yield

    def answered(self, reply: v2.ModelInferResponse) -> v2.ModelInferResponse:
        """Learn from `reply` whether the deployment reads this process's slab."""
        self.shares = self.placing and ASK in reply.parameters and reply.parameters[ASK].bool_param
        return reply


def _placed_inputs(slab: Slab, request: v2.ModelInferRequest) -> list[Ref]:
    """Each raw input of `request` the slab takes written there, named by its block's ref
    (its raw contents left empty)."""
    placed = []
    raw = request.raw_input_contents
    for i, data in enumerate(raw):
        if not data:  # none, or named by a ref already
            continue
        ref = slab.place(np.frombuffer(data, np.uint8))
        if ref is not None:
            raw[i] = b""
            request.inputs[i].parameters[ASK].string_param = ref.text()
            placed.append(ref)
    return placed
