"""The strata.v1 call shape: many requests in, one result each, failures kept apart.

Preprocess and postprocess both serve `Process`; this module runs one handler per request so
that one bad request fails alone and never takes down the others in the call.

A request may be a **flight**: several client requests (its `members`) whose tensors are
stacked along the first dimension. The handler runs once over the whole stack (that is what
makes a flight cheap: every step or rule runs once, vectorised) and the result carries one
`MemberResult` per member, its tensors stacked over the members that succeeded. When that run
fails, or its outputs do not keep one row per input row, each member's rows run alone to find
the ones that fail; the others run again together, so their result is stacked by
construction. A flight's result never carries `error`: each member's outcome is in its
`members` (a malformed flight fails every member). The members share the request's
`parameters`. The work is traced once, in the flight's span, linked to each sampled member's
span (the gateway's span of that request) and with an event for each member that failed: a
request adds no span of its own here, so tracing costs per flight, not per request.

The core is async (the postprocess engine awaits its thread pool); a synchronous handler (the
preprocess pipelines, already on a worker thread) is driven through the same core without an
event loop, since awaiting it never suspends.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc
import numpy as np
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span

from strata.calls import gathering
from strata.errors import InvalidArgument, StrataError, shown, status_of
from strata.proto.v1 import tensor_pb2 as v1
from strata.telemetry import propagation
from strata.wire.codec import Arrays, Place, add_tensors, arrays_to_tensors, tensors_to_arrays

TRACER = trace.get_tracer("strata.calls.v1process")
Info = dict[str, str]
Outputs = tuple[Arrays, Info]
# (pipeline name, tensors, parameters) -> (tensors, info for the caller)
Handler = Callable[[str, Arrays, Mapping[str, str]], Outputs]
AsyncHandler = Callable[[str, Arrays, Mapping[str, str]], Awaitable[Outputs]]
Failure = tuple[grpc.StatusCode, str]
Rows = tuple[int, int]  # [start, stop) in a flight's stack
T = TypeVar("T")

# traceparent flags (characters 53-54 in every version) with the sampled bit set.
_SAMPLED_FLAGS = frozenset(f"{flags:02x}" for flags in range(256) if flags & 1)


# Each result is written in place in the response, its tensors in place in the result: a
# message made apart is copied whole when added to another (a 150 KB crop, twice: about 30 us).


def process_all(
    request: v1.ProcessRequest,
    handler: Handler,
    place: Callable[[v1.Request], Place | None] = lambda item: None,
) -> v1.ProcessResponse:
    """Every request of the call in order, on this thread: the caller hands the whole call
    to one worker thread, never one hand-off per request. `place`: where each request's
    outputs may go in shared memory (strata.wire.slab), None for none."""
    run = _as_async(handler)
    response = v1.ProcessResponse()
    for item in request.requests:
        _complete(process(item, run, response.results.add(), place(item)))
    return response


async def process_all_async(
    request: v1.ProcessRequest, handler: AsyncHandler
) -> v1.ProcessResponse:
    """Every request of the call concurrently, so none waits for another's handler."""
    response = v1.ProcessResponse()
    await gathering.gather(
        [process(item, handler, response.results.add()) for item in request.requests]
    )
    return response


async def process(
    item: v1.Request, handler: AsyncHandler, result: v1.Result, place: Place | None = None
) -> None:
    """One request's `result`: a flight's (see the module docstring), or a plain request's."""
    result.id = item.id
    if item.members:
        await _flight(item, handler, result, place)
        return
    with in_own_trace(item):
        try:
            arrays, info = await handler(
                item.pipeline, tensors_to_arrays(item.tensors), item.parameters
            )
            add_tensors(result.tensors, arrays, place)
        except Exception as exc:  # each request answers for itself, bug or not
            del result.tensors[:]  # any added before the one that failed
            result.error.CopyFrom(error(status_of(exc)))
            return
    result.info.update(info)


@contextlib.contextmanager
def in_own_trace(item: v1.Request) -> Iterator[None]:
    """For a request that came with its own trace context (a call carrying requests of
    several traces), a span of its own in that trace, linked to the call's: the spans of the
    work done for it nest there. Nothing for a request of the call's own trace."""
    if not item.trace_context:
        yield
        return
    call = trace.get_current_span().get_span_context()
    span = TRACER.start_span(
        f"request {item.pipeline}",
        context=propagation.extract(item.trace_context),
        links=[Link(call)] if call.is_valid else [],
        attributes={"strata.pipeline": item.pipeline},
    )
    with propagation.Current(span):
        yield


# Driving the async core with a synchronous handler.


def _as_async(handler: Handler) -> AsyncHandler:
    async def run(pipeline: str, arrays: Arrays, parameters: Mapping[str, str]) -> Outputs:
        return handler(pipeline, arrays, parameters)

    return run


def _complete(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine whose awaits never suspend (a sync handler's) to its end, here."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a synchronous handler's coroutine suspended")


# A flight: its spans.


@dataclass
class _Roster:
    """A flight's members as read from the message, once: each protobuf field access costs
    about as much as the rest of a member's work."""

    ids: list[str]
    counts: list[int]
    contexts: list[Context | None]  # sampled trace contexts only


def _roster(item: v1.Request) -> _Roster:
    read = [(m.id, m.rows, _sampled_context(m.trace_context)) for m in item.members]
    ids, counts, contexts = (list(column) for column in zip(*read, strict=True))
    return _Roster(ids, counts, contexts)


async def _flight(
    item: v1.Request, handler: AsyncHandler, result: v1.Result, place: Place | None
) -> None:
    roster = _roster(item)
    with _flight_span(item, roster) as span:
        landing = await _fly(item, roster.counts, handler, place)
        if span is not None and span.is_recording():
            _record_failures(span, roster, landing.failures)
    _flight_result(roster, landing, result)


def _flight_span(
    item: v1.Request, roster: _Roster
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """The span the flight's work is recorded on, linked to its sampled members: the call's
    own where it records (a span more for the flight would tell nothing the call's does not),
    else one of the flight's own; none at all (not even a non-recording one) when neither the
    call nor any member is sampled."""
    links = [Link(_span_context(c)) for c in roster.contexts if c is not None]
    attributes: dict[str, str | int] = {
        "strata.pipeline": item.pipeline,
        "strata.requests": len(roster.ids),
    }
    call = trace.get_current_span()
    if call.is_recording():
        for link in links:
            call.add_link(link.context)
        call.set_attributes(attributes)
        return contextlib.nullcontext(call)
    if not links:
        return contextlib.nullcontext()
    span = TRACER.start_span(f"flight {item.pipeline}", links=links, attributes=attributes)
    return propagation.Current(span)


def _sampled_context(carrier: Mapping[str, str]) -> Context | None:
    """A member's trace context if its trace is sampled: the flags are read before any
    parsing, so that a member whose trace is not recorded costs next to nothing."""
    if carrier.get("traceparent", "")[53:55] not in _SAMPLED_FLAGS:
        return None
    context = propagation.extract(carrier)
    return context if _span_context(context).is_valid else None


def _span_context(context: Context) -> trace.SpanContext:
    return trace.get_current_span(context).get_span_context()


def _record_failures(span: Span, roster: _Roster, failures: list[Failure | None]) -> None:
    """An event on the flight's span for each member that failed, and why."""
    for rid, failure in zip(roster.ids, failures, strict=True):
        if failure is not None:
            code, message = failure
            span.add_event(
                "member failed",
                {"strata.request_id": rid, "error.code": code.name, "error.message": message},
            )


# A flight: its runs.


@dataclass
class _Landing:
    """How a flight ended: each member's failure (None: it succeeded), the survivors'
    stacked tensors, and the info of their run."""

    failures: list[Failure | None]
    tensors: list[v1.Tensor] = field(default_factory=list)
    info: Info = field(default_factory=dict)


async def _fly(
    item: v1.Request, counts: list[int], handler: AsyncHandler, place: Place | None
) -> _Landing:
    """Run the whole stack once; fall back to finding the failing members when it fails."""
    try:
        stack, bounds = _unpack(item, counts)
    except Exception as exc:  # the flight itself is malformed: nothing can be split
        return _Landing([status_of(exc)] * len(counts))
    whole = await _attempt(handler, item, stack, [(0, bounds[-1][1])])
    if isinstance(whole, Exception):
        return await _fall_back(handler, item, stack, bounds, whole, place)
    return _land([None] * len(bounds), whole, place)


async def _fall_back(
    handler: AsyncHandler,
    item: v1.Request,
    stack: Arrays,
    bounds: list[Rows],
    whole: Exception,
    place: Place | None,
) -> _Landing:
    """Each member alone to find the failing ones; then the others together again."""
    alone = [await _attempt(handler, item, _take(stack, [rows]), [rows]) for rows in bounds]
    failures = [status_of(run) if isinstance(run, Exception) else None for run in alone]
    good = [i for i, failure in enumerate(failures) if failure is None]
    if len(good) <= 1:
        return _land(failures, alone[good[0]] if good else None, place)
    together: Outputs | Exception = whole
    if len(good) < len(bounds):
        kept = [bounds[i] for i in good]
        together = await _attempt(handler, item, _take(stack, kept), kept)
    if isinstance(together, Exception):
        # They succeed alone but not together (e.g. too many rows for one run).
        together = (
            _concatenate([run for run in alone if not isinstance(run, Exception)]) or together
        )
    return _land(failures, together, place)


async def _attempt(
    handler: AsyncHandler, item: v1.Request, stack: Arrays, bounds: Sequence[Rows]
) -> Outputs | Exception:
    """One run over `stack` (the rows of `bounds`): its outputs, or why they cannot serve."""
    rows = sum(stop - start for start, stop in bounds)
    try:
        arrays, info = await handler(item.pipeline, stack, item.parameters)
        _check_rows(arrays, rows)
    except Exception as exc:  # a bug in one run must not fail the flight either
        return exc
    return arrays, info


def _land(
    failures: list[Failure | None], outcome: Outputs | Exception | None, place: Place | None
) -> _Landing:
    """The landing once the survivors' outputs (or why they failed together) are known."""
    if isinstance(outcome, tuple):
        try:
            return _Landing(failures, arrays_to_tensors(outcome[0], place), outcome[1])
        except Exception as exc:  # an output with no v2 datatype fails its members
            outcome = exc
    if isinstance(outcome, Exception):
        failure = status_of(outcome)
        failures = [mine or failure for mine in failures]
    return _Landing(failures)


def _flight_result(roster: _Roster, landing: _Landing, result: v1.Result) -> None:
    result.tensors.extend(landing.tensors)
    result.info.update(landing.info)
    add = result.members.add  # in place: a third of the cost of building a list first
    for rid, count, failure in zip(roster.ids, roster.counts, landing.failures, strict=True):
        if failure is None:
            add(id=rid, rows=count)
        else:
            add(id=rid, error=error(failure))


# A flight: its rows.


def _unpack(item: v1.Request, counts: list[int]) -> tuple[Arrays, list[Rows]]:
    """The decoded stack and each member's rows in it; a flight whose tensors do not add
    up to its members' rows is INVALID_ARGUMENT for every member."""
    stack = tensors_to_arrays(item.tensors)
    if min(counts) < 1:
        bad = item.members[counts.index(min(counts))]
        raise InvalidArgument(
            f"flight member {shown(bad.id)} has {bad.rows} rows; each needs 1 or more"
        )
    stops = list(itertools.accumulate(counts))
    for name, array in stack.items():
        if array.ndim == 0 or array.shape[0] != stops[-1]:
            raise InvalidArgument(
                f"flight tensor {shown(name)} has shape {list(array.shape)}; its first dimension "
                f"must be the members' {stops[-1]} rows"
            )
    return stack, list(zip([0, *stops[:-1]], stops, strict=True))


def _take(stack: Arrays, bounds: Sequence[Rows]) -> Arrays:
    """The rows of `bounds` from every tensor: views for one range, a copy for several."""
    if len(bounds) == 1:
        ((start, stop),) = bounds
        return {name: array[start:stop] for name, array in stack.items()}
    return {
        name: np.concatenate([array[start:stop] for start, stop in bounds])
        for name, array in stack.items()
    }


def _check_rows(arrays: Arrays, rows: int) -> None:
    """Outputs must keep one row per input row, or they cannot be split among members."""
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise StrataError(
                f"output {name!r} has shape {list(array.shape)}, not {rows} rows first, "
                "so it cannot be split among the flight's requests"
            )


def _concatenate(runs: list[Outputs]) -> Outputs | None:
    """Members' alone-results stacked, when their tensors agree in name, datatype and
    trailing dimensions; None when they do not."""
    names = list(runs[0][0])
    if any(list(arrays) != names for arrays, _ in runs):
        return None
    stacked = {}
    for name in names:
        parts = [arrays[name] for arrays, _ in runs]
        if len({part.dtype for part in parts}) != 1:
            return None
        try:
            stacked[name] = np.concatenate(parts)
        except ValueError:  # trailing dimensions differ
            return None
    return stacked, _merge_info([info for _, info in runs])


def _merge_info(infos: list[Info]) -> Info:
    """Info values are comma-separated lists (e.g. skipped_rules): their union, in order."""
    merged: dict[str, dict[str, None]] = {}
    for info in infos:
        for key, value in info.items():
            merged.setdefault(key, {}).update(dict.fromkeys(filter(None, value.split(","))))
    return {key: ",".join(values) for key, values in merged.items()}


def error(failure: Failure) -> v1.Error:
    """A failure as a strata.v1 Error."""
    code, message = failure
    return v1.Error(code=code.value[0], message=message)
