"""Triton's sequence extension, as every layer reads it: a request's sequence flags, and a
stateful model's `sequence:` section of model.yaml.

A request belongs to a sequence when its `sequence_id` parameter is a non-zero uint64 (or
int64) or a non-empty string; `sequence_start` and `sequence_end` mark its first and last
request, and need an id. The model's section names the control inputs the server feeds it
(START, END, READY, CORRID, as Triton's sequence batcher does with the direct strategy) and
its implicit state: an input the server fills with the state output of the sequence's
previous request (zeros at its start). A pipeline that runs such a model declares
`sequence:` itself (PipelineSequence): the gateway then keeps each sequence on one arm and
one replica, in order.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from strata import yamltext
from strata.errors import InvalidArgument, Overloaded, shown
from strata.proto.inference import grpc_service_pb2 as v2

SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END = "sequence_id", "sequence_start", "sequence_end"
FLAGS = (SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END)
# The gateway's client key, sent to inference beside the id: one client's sequence ids
# never reach another's state.
SCOPE = "strata.sequence_scope"
MAX_ID_CHARACTERS = 256
DEFAULT_IDLE_MICROSECONDS = 1_000_000  # Triton's default
MAX_UINT64 = 2**64 - 1

SequenceId = int | str
Key = tuple[str, SequenceId]
T = TypeVar("T")


@dataclass(frozen=True)
class Flags:
    """One request's place in its sequence."""

    id: SequenceId
    start: bool = False
    end: bool = False
    scope: str = ""

    @property
    def key(self) -> tuple[str, SequenceId]:
        return (self.scope, self.id)

    @property
    def named(self) -> str:
        return f"sequence {shown(self.id) if isinstance(self.id, str) else self.id}"


def sequence_flags(parameters: Mapping[str, v2.InferParameter]) -> Flags | None:
    """The request's sequence flags; None when it belongs to no sequence (no id, 0 or "").
    INVALID_ARGUMENT for an id of another type, a negative or over-long one, a flag that is
    not a bool, or a start or end flag without an id."""
    start, end = flag(parameters, SEQUENCE_START), flag(parameters, SEQUENCE_END)
    sequence = _id(parameters.get(SEQUENCE_ID))
    if sequence is None:
        if start or end:
            raise InvalidArgument(
                "sequence_start and sequence_end need a sequence_id: a non-zero integer or a "
                "non-empty string"
            )
        return None
    scope = parameters[SCOPE].string_param if SCOPE in parameters else ""
    return Flags(sequence, start, end, scope)


def _id(value: v2.InferParameter | None) -> SequenceId | None:
    choice = value.WhichOneof("parameter_choice") if value is not None else None
    if value is None or choice is None:
        return None
    if choice == "string_param":
        text = value.string_param
        if len(text) > MAX_ID_CHARACTERS:
            raise InvalidArgument(
                f"sequence_id {shown(text)} is longer than {MAX_ID_CHARACTERS} characters"
            )
        return text or None
    if choice in ("uint64_param", "int64_param"):
        number = getattr(value, choice)
        if number < 0:
            raise InvalidArgument(f"sequence_id must not be negative, got {number}")
        return number or None
    raise InvalidArgument(f"sequence_id must be a uint64 or a string, got {choice}")


def flag(parameters: Mapping[str, v2.InferParameter], name: str) -> bool:
    """A v2 bool parameter; False when absent, INVALID_ARGUMENT when of another kind."""
    if name not in parameters:
        return False
    value = parameters[name]
    choice = value.WhichOneof("parameter_choice")
    if choice != "bool_param":
        raise InvalidArgument(f"parameter {name!r} must be a bool, got {choice or 'nothing'}")
    return value.bool_param


class Controls(BaseModel):
    """The model inputs the server fills with each request's place in its sequence: 1 or 0
    (true or false, in the input's datatype) for start, end and ready, the sequence's id for
    corrid (an integer input takes integer ids, a string input takes either)."""

    model_config = ConfigDict(extra="forbid")

    start: str | None = Field(default=None, description="Input set on a sequence's first request.")
    end: str | None = Field(default=None, description="Input set on a sequence's last request.")
    ready: str | None = Field(
        default=None, description="Input set on every row that holds a request (always, here)."
    )
    corrid: str | None = Field(default=None, description="Input given the sequence's id.")

    def named(self) -> dict[str, str]:
        """Kind (START, END, READY, CORRID) -> input name, for those the model takes."""
        kinds = {"START": self.start, "END": self.end, "READY": self.ready, "CORRID": self.corrid}
        return {kind: name for kind, name in kinds.items() if name}


class State(BaseModel):
    """An implicit state: what `output` gives on one request of a sequence, `input` takes on
    the next; zeros on its first request."""

    model_config = ConfigDict(extra="forbid")

    input: str = Field(description="The model input the state is fed to.")
    output: str = Field(description="The model output the next state is read from.")


class ModelSequence(BaseModel):
    """model.yaml `sequence:`: the model is stateful, and this is how the server drives it."""

    model_config = ConfigDict(extra="forbid")

    control: Controls = Field(default_factory=Controls, description="Control inputs.")
    state: list[State] = Field(default_factory=list, description="Implicit states.")
    max_sequence_idle_microseconds: int = Field(
        default=DEFAULT_IDLE_MICROSECONDS,
        gt=0,
        description="A sequence with no request for this long ends; its slot and state go.",
    )
    max_sequences: int = Field(
        default=1024, gt=0, description="Sequences one replica holds at once (its slots)."
    )

    @model_validator(mode="after")
    def _names_unique(self) -> ModelSequence:
        names = [*self.control.named().values(), *(s.input for s in self.state)]
        if len(set(names)) != len(names):
            raise ValueError(f"control and state inputs repeat a name: {names}")
        return self

    @property
    def fed(self) -> set[str]:
        """The inputs the server feeds: the client's request never carries them."""
        return {*self.control.named().values(), *(s.input for s in self.state)}

    @property
    def kept(self) -> set[str]:
        """The outputs the server keeps as state: never part of an answer."""
        return {s.output for s in self.state}


class PipelineSequence(BaseModel):
    """A pipeline's `sequence:`: its model is stateful (model.yaml `sequence:`), so requests
    carry a sequence id and each sequence stays on one arm and one replica, in order."""

    model_config = ConfigDict(extra="forbid")

    max_sequence_idle_microseconds: int = Field(
        default=DEFAULT_IDLE_MICROSECONDS,
        gt=0,
        description="How long the gateway remembers an idle sequence's arm; its model config "
        "says it to clients. Keep it the model's (model.yaml sequence.max_sequence_idle_"
        "microseconds): the model's decides when the state goes.",
    )
    max_sequences: int = Field(
        default=4096,
        gt=0,
        description="Sequences the gateway tracks at once for the pipeline; a new one past it "
        "is refused with RESOURCE_EXHAUSTED until one ends or idles out.",
    )


def model_sequence(model_folder: Path) -> ModelSequence | None:
    """The `sequence:` section of a repository model's model.yaml, or None. A file that cannot
    be read gives None: the inference service refuses such a model itself, naming why."""
    try:
        raw = yamltext.safe_load((model_folder / "model.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    section = raw.get("sequence") if isinstance(raw, dict) else None
    if section is None:
        return None
    try:
        return ModelSequence.model_validate(section)
    except ValueError:
        return None


@dataclass(eq=False)
class Entry(Generic[T]):
    """One live sequence: what its keeper holds for it, and its requests in turn."""

    value: T
    idle_since: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0  # its requests in turn: a sequence with any is never idle


class Live(Generic[T]):
    """The live sequences of one model or pipeline, least recently used first: each one's
    requests one at a time, in the order they arrived; past `idle_seconds` without a request
    a sequence is freed, and past `limit` live ones a new one is refused (RESOURCE_EXHAUSTED,
    retry after the idle time) until one is."""

    def __init__(self, owner: str, idle_seconds: float, limit: int) -> None:
        self._owner = owner  # "model 'accumulator'", as messages name it
        self._idle = idle_seconds
        self._limit = limit
        self._entries: OrderedDict[Key, Entry[T]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @asynccontextmanager
    async def turn(
        self, flags: Flags, make: Callable[[], T], unknown: bool = False
    ) -> AsyncIterator[Entry[T]]:
        """The sequence's entry for one request, once the requests before it have finished.
        A START makes one with `make` (or starts the sequence over with a fresh value); so
        does any request of a sequence not known here when `unknown` allows it. An answered
        END frees it; a failed request leaves it as it was, except one that made it."""
        self._sweep()
        entry = self._entries.get(flags.key)
        created = entry is None
        if entry is None:
            entry = self._entries[flags.key] = self._new(flags, make, unknown)
        entry.waiting += 1
        try:
            async with entry.lock:
                if self._entries.get(flags.key) is not entry:
                    raise self.not_active(flags)  # it ended while this request waited
                if flags.start and not created:
                    entry.value = make()
                try:
                    yield entry
                except BaseException:
                    if created:
                        self._entries.pop(flags.key, None)
                    raise
                if flags.end:
                    self._entries.pop(flags.key, None)
        finally:
            entry.waiting -= 1
            entry.idle_since = asyncio.get_running_loop().time()
            if flags.key in self._entries:
                self._entries.move_to_end(flags.key)

    def end(self, flags: Flags) -> None:
        """Free the sequence now (its keeper found it cannot go on)."""
        self._entries.pop(flags.key, None)

    def not_active(self, flags: Flags) -> InvalidArgument:
        return InvalidArgument(
            f"{flags.named} of {self._owner} is not active (never started, ended, or idle "
            f"longer than {round(self._idle * 1e6)} µs): send its first request with "
            "sequence_start"
        )

    def _new(self, flags: Flags, make: Callable[[], T], unknown: bool) -> Entry[T]:
        if not (flags.start or unknown):
            raise self.not_active(flags)
        if len(self._entries) >= self._limit:
            raise Overloaded(
                f"{self._owner} holds {self._limit} sequences, its most (max_sequences): "
                "end one, or retry once one has idled out",
                self._idle,
            )
        return Entry(make())

    def _sweep(self) -> None:
        """Free the sequences idle longer than allowed, oldest first."""
        now = asyncio.get_running_loop().time()
        for key, entry in list(self._entries.items()):
            if entry.waiting:
                continue
            if now - entry.idle_since <= self._idle:
                break
            del self._entries[key]


class Books(Generic[T]):
    """The live sequences of each model or pipeline; a reload that changes its limits
    starts them over."""

    def __init__(self, kind: str) -> None:
        self._kind = kind  # "model", "pipeline"
        self._live: dict[str, tuple[tuple[int, int], Live[T]]] = {}

    def of(self, name: str, idle_microseconds: int, limit: int) -> Live[T]:
        limits = (idle_microseconds, limit)
        held = self._live.get(name)
        if held is None or held[0] != limits:
            live = Live[T](f"{self._kind} {name!r}", idle_microseconds / 1e6, limit)
            held = self._live[name] = (limits, live)
        return held[1]
