"""Tracing and logging set-up, the same in every service.

Trace context always flows through every hop (W3C traceparent in gRPC metadata), so logs
carry trace ids; spans are recorded only when sampled, and nothing is sampled unless an OTLP
endpoint is configured (or OTEL_EXPORTER_OTLP_ENDPOINT is set): an unsampled request pays for
its ids and nothing more. Tests pass their own provider.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from strata.errors import bounded
from strata.telemetry import propagation
from strata.telemetry.metrics import RPC_DURATION, RPCS, Children
from strata.telemetry.spanexport import ChildSpanExporter

if TYPE_CHECKING:
    import numpy as np

    _Call = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger(__name__)
LOG_MESSAGE_BYTES = 8192  # of one log line's message
LOG_TRACE_BYTES = 6144  # of one log line's traceback
# The resource attribute naming an inference process's deployment (`a`), on all its spans.
DEPLOYMENT_ATTRIBUTE = "strata.deployment"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, service (and the inference deployment an
    inference process serves, or the worker's index among a gateway's processes), logger,
    message, trace and span ids.

    The message and any traceback are cut (strata.errors.bounded), so that whatever a client
    put into them, a line stays within about 16 KiB."""

    converter: Callable[[float | None], time.struct_time] = time.gmtime

    def __init__(
        self, service: str, deployment: str | None = None, worker: int | None = None
    ) -> None:
        super().__init__()
        self.service = service
        self.deployment: dict[str, str | int] = {"deployment": deployment} if deployment else {}
        if worker is not None:
            self.deployment["worker"] = worker

    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            **self.deployment,
            "logger": record.name,
            "msg": _fitted(record.getMessage(), LOG_MESSAGE_BYTES),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            event["trace_id"] = format(context.trace_id, "032x")
            event["span_id"] = format(context.span_id, "016x")
        kind = getattr(record, "error_kind", None)
        if kind:
            event["error_kind"] = kind
        if record.exc_info:
            event["exception"] = _fitted(self.formatException(record.exc_info), LOG_TRACE_BYTES)
        return json.dumps(event, ensure_ascii=False)


def _fitted(text: str, limit: int) -> str:
    """`text` cut so that it takes at most `limit` bytes in the JSON line, where escapes
    (a newline's \\n, a control character's \\u0000) make it longer than it is."""
    budget = limit
    while True:
        out = bounded(text, budget)
        size = len(json.dumps(out, ensure_ascii=False).encode()) - 2  # without the quotes
        if size <= limit:
            return out
        budget = budget * limit // size


def setup_logging(
    service: str, level: str, deployment: str | None = None, worker: int | None = None
) -> None:
    """Structured JSON logs on stderr, one event per line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, deployment, worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def setup_tracing(
    service: str,
    otlp_endpoint: str | None = None,
    sample_ratio: float = 1.0,
    trust_callers: bool = True,
    deployment: str | None = None,
) -> TracerProvider:
    """Install a tracer provider for `service`, exporting over OTLP if an endpoint is set
    (here or in OTEL_EXPORTER_OTLP_ENDPOINT), sampling `sample_ratio` of new traces; without
    an endpoint, spans would go nowhere, so none is sampled.

    Trusted callers (the internal hops, under mutual TLS) decide for their callees: their
    sampled flag is followed. A public server's callers are clients (`trust_callers=False`):
    their trace id is kept, but whether it is sampled is `sample_ratio`'s decision, so a
    client's `traceparent` cannot raise the sampling rate; the decision made here then
    propagates to the hops behind."""
    global _sampling, _ratio
    endpoint = otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    sampler: Sampler | None = (
        None  # the SDK then honours OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG
    )
    _sampling, _ratio = "sdk", None
    if not endpoint:
        sampler, _sampling = ALWAYS_OFF, "off"
    elif "OTEL_TRACES_SAMPLER" not in os.environ:
        _ratio = LiveRatio(sample_ratio)
        sampler, _sampling = _sampler(_ratio, trust_callers)
    attributes = {"service.name": service}
    if deployment:
        attributes[DEPLOYMENT_ATTRIBUTE] = deployment
    provider = TracerProvider(
        resource=Resource.create(attributes), sampler=sampler, id_generator=_CHOSEN_IDS
    )
    if endpoint:
        exporter = ChildSpanExporter(provider.resource, endpoint)
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                schedule_delay_millis=_small("OTEL_BSP_SCHEDULE_DELAY", SMALL_DELAY_MILLIS),
                max_export_batch_size=_small("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", SMALL_BATCH),
            )
        )
        log.info("exporting traces to %s (from a child process)", endpoint)
    trace.set_tracer_provider(provider)
    return provider


class LiveRatio(Sampler):
    """Sampling of new traces at a ratio that may change while the server runs (Triton's
    trace settings API): the ratio's sampler is swapped whole, never changed in place."""

    def __init__(self, ratio: float) -> None:
        self._sampler = TraceIdRatioBased(ratio)

    @property
    def ratio(self) -> float:
        return self._sampler.rate

    def change(self, ratio: float) -> None:
        self._sampler = TraceIdRatioBased(ratio)

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return self._sampler.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return f"LiveRatio{{{self.ratio}}}"

    def samples(self, trace_id: int) -> bool:
        """The decision `should_sample` makes for a trace id, without the SDK's objects."""
        sampler = self._sampler
        return trace_id & sampler.TRACE_ID_LIMIT < sampler.bound


class _ChosenTraceIds(RandomIdGenerator):
    """The SDK's random ids, except a new trace's id where `server_span` chose it already
    (to decide its sampling before asking the SDK for a span)."""

    def generate_trace_id(self) -> int:
        return _CHOSEN_TRACE_ID.get() or super().generate_trace_id()


_CHOSEN_TRACE_ID: ContextVar[int] = ContextVar("strata_chosen_trace_id", default=0)
_NEW_IDS = RandomIdGenerator()
_CHOSEN_IDS = _ChosenTraceIds()


def exporting() -> bool:
    """Whether spans that record go anywhere: an OTLP endpoint is set."""
    return _sampling != "off"


def set_sample_ratio(ratio: float) -> bool:
    """Sample `ratio` (0 to 1) of new traces from now on; False where no ratio is set here
    (nothing changes): without an OTLP endpoint nothing is sampled, and OTEL_TRACES_SAMPLER
    leaves sampling to the SDK."""
    if _ratio is None:
        return False
    _ratio.change(ratio)
    return True


def _sampler(root: Sampler, trust_callers: bool) -> tuple[Sampler, str]:
    """Parent-based sampling by `root`; a remote parent's flag counts only if trusted."""
    if trust_callers:
        return ParentBased(root), "parent"
    return ParentBased(root, remote_parent_sampled=root, remote_parent_not_sampled=root), "ratio"


# Hand spans to the exporter process in small batches often: even copying a span into its
# record holds the GIL, and the SDK's 512 every 5 s stalled the event loop at a time.
# OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_MAX_EXPORT_BATCH_SIZE still override.
SMALL_DELAY_MILLIS, SMALL_BATCH = 100, 32


def _small(variable: str, value: int) -> int | None:
    """`value`, unless the environment sets `variable` (None: the SDK reads it then)."""
    return None if variable in os.environ else value


_server_tracer = trace.get_tracer("strata.rpc.server")
# What setup_tracing installed: "off" (nothing is sampled), "parent" (a caller's unsampled
# trace stays unsampled), "ratio" (the ratio decides whatever the caller says), or "sdk" (a
# sampler or provider of someone else's: ask the SDK).
_sampling = "sdk"
_ratio: LiveRatio | None = None  # the ratio setup_tracing installed, where it did


def server_span(name: str, carrier: Mapping[str, str]) -> AbstractContextManager[trace.Span]:
    """The current span for serving a call whose metadata is `carrier`: the SDK's server span
    where it may be recorded; else a non-recording span that carries the caller's trace (or a
    new one, for the logs' trace ids), at a tenth of the SDK's cost.

    Where the ratio decides whatever the caller says (a public server), the decision is
    taken here, on the trace id the SDK would decide on (the caller's, or a new one handed to
    the SDK's id generator): only a sampled request pays for the SDK's span."""
    traceparent = carrier.get("traceparent", "")
    if _sampling == "ratio" and _ratio is not None:
        return _ratio_span(_ratio, name, carrier, traceparent)
    if _sampling == "off" or (_sampling == "parent" and traceparent[53:55] == "00"):
        return _unsampled(_trace_id(traceparent))
    return _sdk_span(name, propagation.extract(carrier) if traceparent else None)


def _ratio_span(
    ratio: LiveRatio, name: str, carrier: Mapping[str, str], traceparent: str
) -> AbstractContextManager[trace.Span]:
    parent = propagation.extract(carrier) if traceparent else None
    caller = trace.get_current_span(parent).get_span_context() if parent else None
    if caller is not None and caller.is_valid:
        trace_id = caller.trace_id
        if ratio.samples(trace_id):
            return _sdk_span(name, parent)
    else:
        trace_id = _NEW_IDS.generate_trace_id()
        if ratio.samples(trace_id):
            token = _CHOSEN_TRACE_ID.set(trace_id)
            try:
                return _sdk_span(name, Context())  # a root span: its trace id is the one chosen
            finally:
                _CHOSEN_TRACE_ID.reset(token)
    return _unsampled(trace_id)


def _sdk_span(name: str, parent: Context | None) -> AbstractContextManager[trace.Span]:
    span = _server_tracer.start_span(
        name, context=parent, kind=SpanKind.SERVER, record_exception=False
    )
    return propagation.Current(span, record_exception=False)


def _unsampled(trace_id: int) -> AbstractContextManager[trace.Span]:
    """A non-recording span in trace `trace_id` (with a span id of its own), made current."""
    context = SpanContext(trace_id, random.getrandbits(64), is_remote=False)
    return propagation.Current(NonRecordingSpan(context), record_exception=False)


def _trace_id(traceparent: str) -> int:
    """The caller's trace id, or a new one."""
    if not traceparent:  # most clients send none: no exception raised and caught for them
        return _NEW_IDS.generate_trace_id()
    try:
        trace_id = int(traceparent[3:35], 16)
    except ValueError:
        trace_id = 0
    return trace_id or _NEW_IDS.generate_trace_id()


def traced_servicer(servicer: object, service: str) -> object:
    """`servicer` as a server should register it: each unary method wrapped, once at start-up,
    in a server span in the caller's trace (recorded only when that trace is sampled) and the
    RPC's count and duration by method and status code. Streaming methods pass through.

    Wrapping the methods, not intercepting calls: a grpc.aio server interceptor runs its
    pipeline in Python on every call, which measured about 0.15 ms of the gateway's CPU per
    request (digits, 64 in flight) — at the gateway every client request is a call."""
    methods = descriptor_pool.Default().FindServiceByName(service).methods
    wrapped = types.SimpleNamespace()
    for method in methods:
        handler = getattr(servicer, method.name)
        if not (method.client_streaming or method.server_streaming):
            handler = _served(f"/{service}/{method.name}", handler)
        setattr(wrapped, method.name, handler)
    return wrapped


class Meter:
    """One method's `strata_rpc_server_*` figures: a unary call's, or a stream message's
    (each message of ProcessStream or ModelStreamInfer is a call of its own to its caller)."""

    def __init__(self, method: str) -> None:
        self.method = method
        self._counts = Children(RPCS)
        self._duration = RPC_DURATION.labels(method)

    def record(self, code: grpc.StatusCode, seconds: float) -> None:
        self._counts(self.method, code.name).inc()
        self._duration.observe(seconds)


def _served(
    method: str, handler: Callable[[Any, _Call], Awaitable[Any]]
) -> Callable[[Any, _Call], Awaitable[Any]]:
    meter = Meter(method)

    async def served(request: Any, context: _Call) -> Any:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        with server_span(method, propagation.call_metadata(context)) as span:
            try:
                return await handler(request, context)
            except BaseException:
                status = context.code()
                code = status if isinstance(status, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
                raise
            finally:
                if span.is_recording():
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                meter.record(code, time.perf_counter() - started)

    return served


def outgoing(metadata: Sequence[tuple[str, str]] = ()) -> tuple[tuple[str, str], ...]:
    """The metadata for a call to the next hop, with the current trace context in it. No
    client span: the next hop's server span is the call's, and the caller records how long
    the call took as an attribute of its own span (a span per hop cost more than it told)."""
    carrier: dict[str, str] = {}
    propagation.inject(carrier)
    return (*metadata, *carrier.items())


def recording() -> bool:
    """Whether the current span records (its trace is sampled): worth annotating."""
    return trace.get_current_span().is_recording()


def annotate(**attributes: AttributeValue) -> None:
    """Set `strata.<name>` attributes on the current span (tuples/lists become arrays)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({f"strata.{key}": value for key, value in attributes.items()})


def record_error(code_name: str, kind: str, message: str) -> None:
    """An error event on the current span, with its kind and whether a retry may help."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            "error",
            {
                "error.kind": kind,
                "error.code": code_name,
                "error.retryable": kind in ("retryable", "overload"),
                "error.message": message,
            },
        )
        span.set_status(Status(StatusCode.ERROR, f"{code_name}: {message}"))


def shapes(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Tensor shapes as span attribute values, e.g. ["images:1x8x8"]."""
    return [f"{name}:{'x'.join(map(str, a.shape))}" for name, a in arrays.items()]
