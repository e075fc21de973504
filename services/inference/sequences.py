"""Stateful models: each sequence's slot, its implicit state, its order and its idle timeout.

Triton's sequence batcher, direct strategy: a sequence holds a slot from its START request
until its END request, or until it has been idle `max_sequence_idle_microseconds`; past
`max_sequences` slots a new sequence is refused (RESOURCE_EXHAUSTED) until one is freed. The
requests of one sequence run one at a time, in the order they arrived; requests of different
sequences share batches as any others do (one row each), so READY is 1 on every row that
runs (no batch here holds an empty slot). Each request is given its control inputs (START,
END, READY, CORRID) and its state: the state output of the sequence's previous request, or
zeros at its start. A request that fails leaves the state as it was, and its sequence going
(an END that fails can be sent again); only an answered request moves the state on.

A sequence stays on the model version it started on; when that version stops serving (a
hot swap, an unload), its next request is refused and the sequence must start again.
Sequences are keyed by the gateway's client key (strata.wire.triton_sequences.SCOPE) and the id, so
one client's ids never reach another's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from services.inference.jobs import Request
from services.inference.sequence_graph import row_shape
from strata.errors import InvalidArgument, StrataError
from strata.models.onnxsig import TensorInfo
from strata.wire.codec import DTYPES, Arrays
from strata.wire.triton_sequences import Books, Flags, ModelSequence, SequenceId

if TYPE_CHECKING:
    from services.inference.model import ModelVersion


def refuse_stateless(model: ModelVersion) -> None:
    """INVALID_ARGUMENT for a request to a stateful model that belongs to no sequence."""
    if model.spec.sequence is not None:
        raise InvalidArgument(
            f"model {model.name!r} is stateful: each request belongs to a sequence; send "
            "sequence_id, with sequence_start on a sequence's first request"
        )


def client_tensors(model: ModelVersion) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The model's inputs and outputs as a client sees them: without the control and state
    inputs the server feeds and the state outputs it keeps."""
    sequence, signature = model.spec.sequence, model.signature
    if sequence is None:
        return signature.inputs, signature.outputs
    inputs = [t for t in signature.inputs if t.name not in sequence.fed]
    return inputs, [t for t in signature.outputs if t.name not in sequence.kept]


@dataclass
class Held:
    """What a live sequence holds: the version it runs on, and its state for the next
    request (state input name -> value; empty: zeros)."""

    version: int
    state: Arrays = field(default_factory=dict)


class Sequences:
    """The live sequences of every stateful model this service serves."""

    def __init__(self, resolve: Callable[[str, str], ModelVersion]) -> None:
        self._resolve = resolve
        self._books = Books[Held]("model")

    async def infer(
        self, name: str, version: str, flags: Flags, arrays: Arrays, options: Request
    ) -> tuple[ModelVersion, Arrays]:
        """Run one request of a sequence on the version it started on; the version and its
        outputs (the state outputs kept, not answered)."""
        model = self._resolve(name, version)
        spec = model.spec.sequence
        if spec is None:
            raise InvalidArgument(
                f"model {name!r} is stateless: it takes no sequence; send the request "
                "without sequence_id, sequence_start and sequence_end"
            )
        live = self._books.of(name, spec.max_sequence_idle_microseconds, spec.max_sequences)
        async with live.turn(flags, lambda: Held(model.version)) as entry:
            held = entry.value
            if held.version != model.version:
                try:
                    model = self._started_on(name, held.version, flags)
                except InvalidArgument:
                    live.end(flags)  # its state belongs to a version that is gone
                    raise
                spec = model.spec.sequence or spec  # that version's own section
            outputs = await self._run(model, spec, flags, held, arrays, options)
        return model, outputs

    def _started_on(self, name: str, version: int, flags: Flags) -> ModelVersion:
        try:
            return self._resolve(name, str(version))
        except StrataError:
            raise InvalidArgument(
                f"{flags.named} started on model {name!r} version {version}, which no longer "
                "serves: start it again with sequence_start"
            ) from None

    async def _run(
        self,
        model: ModelVersion,
        spec: ModelSequence,
        flags: Flags,
        held: Held,
        arrays: Arrays,
        options: Request,
    ) -> Arrays:
        fed = spec.fed & set(arrays)
        if fed:
            raise InvalidArgument(
                f"input {sorted(fed)[0]!r} of model {model.name!r} is the server's to fill "
                "(its sequence control or state); leave it out"
            )
        rows = {array.shape[0] if array.ndim else 1 for array in arrays.values()}
        if rows != {1}:
            raise InvalidArgument(
                f"a request of a sequence holds one row; model {model.name!r} got {sorted(rows)}"
            )
        inputs = {t.name: t for t in model.signature.inputs}
        full = {**arrays, **_controls(spec, flags, inputs), **_states(spec, held, inputs)}
        outputs = await model.infer(full, options)
        held.state = {s.input: outputs[s.output] for s in spec.state}
        return {name: value for name, value in outputs.items() if name not in spec.kept}


def _controls(spec: ModelSequence, flags: Flags, inputs: dict[str, TensorInfo]) -> Arrays:
    values = {"START": flags.start, "END": flags.end, "READY": True, "CORRID": flags.id}
    return {
        name: _filled(inputs[name], values[kind], kind)
        for kind, name in spec.control.named().items()
    }


def _filled(info: TensorInfo, value: bool | SequenceId, kind: str) -> np.ndarray:
    shape = row_shape(info)
    if info.datatype == "BYTES":
        return np.full(shape, str(value).encode(), dtype=object)
    dtype = DTYPES[info.datatype]
    if kind == "CORRID" and (isinstance(value, str) or not _fits(value, dtype)):
        raise InvalidArgument(
            f"sequence_id {value!r} does not fit this model's CORRID input {info.name!r} "
            f"({info.datatype}): send an id it can hold"
        )
    return np.full(shape, value, dtype=dtype)


def _fits(value: int, dtype: np.dtype) -> bool:
    limits = np.iinfo(dtype)
    return limits.min <= value <= limits.max


def _states(spec: ModelSequence, held: Held, inputs: dict[str, TensorInfo]) -> Arrays:
    return {
        s.input: held.state[s.input]
        if s.input in held.state
        else np.zeros(row_shape(inputs[s.input]), dtype=DTYPES[inputs[s.input].datatype])
        for s in spec.state
    }
