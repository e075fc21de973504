"""The gateway's channels to the layers behind it, each guarded by a circuit breaker.

Every call passes on what is left of the caller's deadline (strata.wire.deadline) as its gRPC
deadline; every failure comes back as the upstream's own status code with the hop named in
the message. gRPC's retry policy (in the channel's service config) retries UNAVAILABLE on
another replica; the breaker sees only what is left after those retries (an inference call:
the breaker of its model on that deployment). Until an upstream is first reached, a call
waits for it to connect (gRPC's wait_for_ready) within its own timeout, instead of failing at
once while the upstream is still starting. Trace context goes in each call's metadata
(strata.telemetry.tracing.outgoing); how long each hop took goes on the caller's span as
`strata.hop.<hop>_ms` when its trace is sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.metrics import BREAKER_OPEN, UPSTREAM_CALLS
from services.gateway.upstream import split
from services.gateway.upstream.breaker import Breakers, CircuitBreaker
from services.gateway.upstream.hoptime import HopTimer, Load, Timing
from services.gateway.upstream.lanes import (
    Answer,
    LaneBroken,
    Lanes,
    Metadata,
    Reply,
    Request,
    Spread,
    StreamMethod,
)
from services.gateway.upstream.pipes import Pipes
from services.gateway.upstream.sequences import replica
from services.gateway.upstream.slabs import HopSlabs, InferenceSlabs, Passed, ProcessSlabs
from services.gateway.upstream.stream_methods import infer_stream, process_stream
from services.gateway.upstream.stubs import InferenceStub, ProcessStub
from strata.config import Settings
from strata.config.endpoints import ServiceEndpoint
from strata.config.gateway import GatewaySettings
from strata.errors import DeadlineExceeded, Unavailable, from_code, hinted_retry
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.rpc.grpc_channels import open_channel
from strata.telemetry.tracing import annotate, outgoing, recording
from strata.wire.deadline import Deadline
from strata.wire.slab import open_slab
from strata.wire.stack import Raw
from strata.wire.triton_sequences import Flags

log = logging.getLogger(__name__)

INFERENCE_SERVICE = "inference.GRPCInferenceService"


TIMEOUT_ATTEMPTS = 3
# A retry after a missed timeout waits this many times as long: where every replica misses it
# (the whole host slowed, not one replica hung), the same timeout again would miss again, as
# the calls it cuts teach the hop nothing of the slower times.
RETRY_PATIENCE = 2.0
LANE_SECONDS = 10.0
READY_PROBE_SECONDS = 2.0  # how long a ModelReady or ModelConfig probe waits for a deployment
# A server that answers these to ModelConfig will not say a model's max_batch_size.
UNSAID = {
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
}


class HopTimedOut(Unavailable):
    """The hop missed its own timeout: hung, or far slower than it normally is."""


Stub = TypeVar("Stub")  # what the generated stub class makes of a channel (upstream/stubs.py)


class Hop(Generic[Stub, Request, Answer, Reply]):
    """One upstream: a traced channel with retries, a stub, and a circuit breaker. A hop's
    calls (`call`) are of one kind: `Request` answered by `Reply`, or by `Answer` on a lane."""

    def __init__(
        self,
        name: str,
        channel: grpc.aio.Channel,
        stub: Callable[[grpc.aio.Channel], Stub],
        gateway: GatewaySettings,
        replicated: bool,
        streams: Mapping[str, Callable[[Stub], StreamMethod[Request, Answer, Reply]]] | None = None,
        lane_lifetime: float = LANE_SECONDS,
        replicas: Sequence[grpc.aio.Channel] = (),
        slabs: HopSlabs[Request, Reply] | None = None,
        held: int = 0,
        piped: Callable[
            [StreamMethod[Request, Answer, Reply], int], StreamMethod[Request, Answer, Reply]
        ]
        | None = None,
    ) -> None:
        """A hop over `channel`; `replicated`: whether another replica may answer behind it
        (a retry or a refused message may then go there); `replicas`: a channel to each
        replica where they are known, each then given lanes of its own (else the lanes
        share `channel`, whose round-robin places each as it opens) and sent at most `held`
        messages at once (0: no bound; lanes.py's Spread); `slabs`: where a strata.v1 hop's
        answers may come through shared memory (upstream/slabs.py); `piped`: a lane method
        for the replica of that index (its channel's), opened on its pipe where it has one
        (upstream/pipes.py)."""
        self.name = name
        self._timed_as = f"hop.{name}_ms"  # strata.hop.<hop>_ms on the caller's span
        self.channel = channel
        self.stub = stub(channel)
        self._replicas = list(replicas)
        self.lanes = {
            method: Spread(
                [
                    Lanes(
                        f"{name} {method}" + (f" (replica {i})" if self._replicas else ""),
                        piped(make(stub(lane_channel)), i) if piped else make(stub(lane_channel)),
                        gateway.stream_lanes,
                        lane_lifetime,
                        functools.partial(_ready, lane_channel),
                        (name, str(i)),
                    )
                    for i, lane_channel in enumerate(self._replicas or [channel])
                ],
                held if self._replicas else 0,
            )
            for method, make in (streams or {}).items()
        }
        self.breaker = Breakers(name, gateway.breaker)
        self.timer = HopTimer(
            gateway.hop_timeouts, gateway.upstream_timeout_seconds, held if self._replicas else 0
        )
        self.replicated = replicated
        self._split_bytes = gateway.split_flight_bytes
        self._whole: set[str] = set()  # pipelines whose outputs cannot be stacked again
        self._reached = False  # whether the channel has connected since the gateway started
        self._slabs = slabs
        # A preprocess hop's parts may answer by ref (upstream/slabs.py's Passed).
        self._passed: Passed | None = getattr(slabs, "passed", None)
        # And its flights' photos, placed in this process's slab, are cut into parts by ref.
        self._placed: Callable[[v1.Tensor], Raw | None] = getattr(
            slabs, "placed", lambda tensor: None
        )

    def configure(self, gateway: GatewaySettings) -> None:
        """New breaker thresholds and hop timeouts, live."""
        self.breaker.settings = gateway.breaker
        self._split_bytes = gateway.split_flight_bytes
        self.timer.configure(gateway.hop_timeouts, gateway.upstream_timeout_seconds)

    async def call(
        self,
        method: str,
        request: Request,
        deadline: Deadline,
        metadata: Metadata = (),
        spare: bool | None = None,
    ) -> Reply:
        """Call `method` by the caller's `deadline` (`_call_whole`), a big flight cut into a
        part for each replica that takes messages (upstream/split.py)."""
        if not self._splits(method, request):
            return await self._call_whole(method, request, deadline, metadata, spare)
        # Placed in the slab once for the whole flight: its parts name parts of the blocks.
        with self._slabs.carrying(request) if self._slabs else contextlib.nullcontext():
            return await self._in_parts(method, request, deadline, metadata, spare)

    async def _in_parts(
        self,
        method: str,
        request: Request,
        deadline: Deadline,
        metadata: Metadata,
        spare: bool | None,
    ) -> Reply:
        """`call` for a flight that may be cut: in parts where it is worth it, else whole."""
        lanes = self.lanes[method]
        process = cast(v1.ProcessRequest, request)  # a strata.v1 hop's (`_splits`)
        cut = split.parts(process, lanes.taking, self._split_bytes, self._placed)
        pieces = cast(list[Request], cut)
        if not pieces:
            return await self._call_whole(method, request, deadline, metadata, spare)
        calls = [
            asyncio.ensure_future(self._call_whole(method, piece, deadline, metadata, spare))
            for piece in pieces
        ]
        try:
            replies = await asyncio.gather(*calls)
        except BaseException:
            for call in calls:  # a part failed (or the caller gave up): the others are moot
                # An error is seen here (only the first part's is raised); a reply dropped.
                if call.done() and not call.cancelled() and call.exception() is None:
                    self._drop(call.result())
                call.cancel()
            raise
        merged = split.merge(cast(list[v1.ProcessResponse], replies), self._passed)
        if merged is not None:
            return cast(Reply, merged)
        for reply in replies:
            self._drop(reply)
        pipeline = cast(v1.ProcessRequest, request).requests[0].pipeline
        log.warning(
            "%s: pipeline %r's outputs differ by part; its flights go whole", self.name, pipeline
        )
        self._whole.add(pipeline)
        return await self._call_whole(method, request, deadline, metadata, spare)

    def _drop(self, reply: Reply) -> None:
        """Give back the blocks a part's reply names: nothing will read them."""
        if self._passed is not None:  # a preprocess hop's: its Reply is a ProcessResponse
            self._passed.dropped(cast(v1.ProcessResponse, reply))

    def _splits(self, method: str, request: Request) -> bool:
        """Whether a call may be cut into parts: a strata.v1 flight's, on lanes to several
        replicas, of a pipeline whose parts' outputs stack again."""
        if method not in self.lanes or not self._replicas:
            return False
        if not isinstance(request, v1.ProcessRequest):
            return False
        return not any(item.pipeline in self._whole for item in request.requests)

    async def _call_whole(
        self,
        method: str,
        request: Request,
        deadline: Deadline,
        metadata: Metadata = (),
        spare: bool | None = None,
    ) -> Reply:
        """`_attempts`, with big tensors through shared memory where the hop has slabs."""
        if self._slabs is None:
            return await self._attempts(method, request, deadline, metadata, spare)
        with self._slabs.carrying(request):
            reply = await self._attempts(method, request, deadline, metadata, spare)
        return self._slabs.answered(reply)

    async def _attempts(
        self,
        method: str,
        request: Request,
        deadline: Deadline,
        metadata: Metadata = (),
        spare: bool | None = None,
    ) -> Reply:
        """Call `method` by the caller's `deadline` (DEADLINE_EXCEEDED without a call once it
        has passed), and within this hop's own timeout when another replica or arm could
        answer instead (`spare`; by default, when the hop has several replicas).

        Running out of the caller's time says nothing about the upstream; missing the hop's
        own timeout does: it counts against the breaker and is UNAVAILABLE (answer elsewhere).
        A call to a replicated hop that missed its own timeout goes again (up to
        TIMEOUT_ATTEMPTS in all, each waiting RETRY_PATIENCE times the last one's timeout),
        balanced to another replica, while the deadline allows: until gRPC's outlier detection
        ejects a hung replica, a retry may meet it again.
        """
        budget = deadline.remaining(self.name)
        breaker = self.breaker[getattr(request, "model_name", "")]
        if not breaker.allow():
            UPSTREAM_CALLS(self.name, "CIRCUIT_OPEN").inc()
            raise Unavailable(f"{breaker.name}: circuit open after repeated failures")
        bounded = self.replicated if spare is None else spare
        load = Load.of(request)
        attempts = tries = TIMEOUT_ATTEMPTS if self.replicated else 1
        sent = outgoing(metadata)
        started = time.monotonic()
        missed = 0.0  # the timeout the last attempt missed
        try:
            while True:
                timing = self.timer.begin(load, bounded, RETRY_PATIENCE * missed)
                try:
                    return await self._call(
                        method, request, budget, sent, breaker, timing, first=attempts == tries
                    )
                except HopTimedOut:
                    missed = timing.timeout
                    attempts -= 1
                    budget = deadline.left()
                    if attempts == 0 or budget <= 0:
                        raise
                finally:
                    self.timer.end(timing)
        finally:
            if recording():
                annotate(**{self._timed_as: (time.monotonic() - started) * 1e3})

    async def _call(
        self,
        method: str,
        request: Request,
        budget: float,
        metadata: Metadata,
        breaker: CircuitBreaker,
        timing: Timing,
        first: bool = True,
    ) -> Reply:
        """One attempt; `timing`: what the call carries and the hop's own timeout for it."""
        load, timeout = timing.load, timing.timeout
        hop_bound = timeout < budget
        code = grpc.StatusCode.CANCELLED
        sent = Sent()
        waited = self._waits()
        try:
            reply = await self._send(
                method, request, budget, timing, metadata, hop_bound, first, sent
            )
            code = grpc.StatusCode.OK
            if not waited:  # a wait for the upstream to start is not the hop's latency
                self.timer.observe(time.monotonic() - sent.at, load)
            return reply
        except DeadlineExceeded:  # its time ran out waiting for a replica with room
            code = grpc.StatusCode.DEADLINE_EXCEEDED
            raise
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and hop_bound:
                code = grpc.StatusCode.UNAVAILABLE
                if not self.replicated:
                    # At least this long: lets a slow arm's timeout grow. With replicas, a
                    # miss is one replica's (outlier detection ejects it); the others'
                    # answers keep the P99, so a hung one cannot stretch everyone's timeout.
                    self.timer.observe(timeout, load)
                raise HopTimedOut(
                    f"{self.name}: no answer within {timeout:.3g}s, its own timeout for "
                    f"{load.rows} rows and {load.bytes} bytes (a multiple of its recent P99)"
                ) from None
            if code == grpc.StatusCode.CANCELLED:
                # Our caller did not cancel (that would cancel this task instead): the upstream
                # dropped the call, e.g. while shutting down. Another replica or arm may answer.
                code = grpc.StatusCode.UNAVAILABLE
                raise Unavailable(f"{self.name}: the call was dropped ({exc.details()})") from None
            retry = hinted_retry(exc.trailing_metadata())
            raise from_code(code, f"{self.name}: {exc.details()}", retry) from None
        finally:
            breaker.record(code)
            UPSTREAM_CALLS(self.name, code.name).inc()
            BREAKER_OPEN(breaker.name).set(breaker.state == "open")

    async def _send(
        self,
        method: str,
        request: Request,
        budget: float,
        timing: Timing,
        metadata: Metadata,
        hop_bound: bool,
        first: bool,
        sent: Sent,
    ) -> Reply:
        """The reply within `budget` and the attempt's own window (`timing.timeout`): as a
        message on a lane of the least loaded replica where the hop has lanes for `method`;
        as a unary call otherwise, when the lane broke (a fresh window: the lane's wait was
        the broken lane's, not this replica's), or when a replica answered UNAVAILABLE (gRPC's
        retry policy then sends it to another one). A retry after a missed hop timeout goes
        unary too: round-robin takes it to the next replica, where a new lane might meet the
        hung one again."""
        window = timing.timeout
        lanes = self.lanes.get(method)
        if first and lanes is not None and lanes.usable:
            started = time.monotonic()
            try:
                return await lanes.call(
                    request,
                    min(budget, window),
                    hop_bound,
                    metadata,
                    timing.load.rows,
                    patience=budget,
                    claimed=sent.now,
                )
            except LaneBroken:
                pass
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or not self.replicated:
                    raise
            budget -= time.monotonic() - started
        timeout = max(min(budget, window), 0.0)
        call: grpc.aio.UnaryUnaryMultiCallable[Request, Reply] = getattr(self.stub, method)
        sent.now()
        return await call(
            request, timeout=timeout, metadata=metadata, wait_for_ready=not self._reached
        )

    def _waits(self) -> bool:
        """Whether a call waits for the channel to connect (wait_for_ready) rather than fail
        at once: until the upstream is first reached, as it may still be starting (an
        inference deployment loads and warms its models before it listens). Once reached, a
        call to an upstream that went away fails at once, to be answered elsewhere. A lane
        that takes messages has reached its replica, whatever the shared channel's state."""
        if not self._reached:
            ready = self.channel.get_state() == grpc.ChannelConnectivity.READY
            self._reached = ready or any(lanes.taking for lanes in self.lanes.values())
        return not self._reached

    async def healthy(self, timeout: float) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            # The health stubs declare HealthStub without its methods (sync and aio differ).
            reply: health_pb2.HealthCheckResponse = await stub.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def model_ready(
        self: InferenceHop, probe: v2.ModelReadyRequest, timeout: float = READY_PROBE_SECONDS
    ) -> bool:
        """The upstream's answer to a v2 ModelReady `probe`: False without a call while the
        model's breaker is open, and a failed call counts for the breaker, as ModelInfer's
        do; the call carries the caller's trace. Not timed: a probe's latency is not the
        hop's P99."""
        breaker = self.breaker[probe.name]
        if not breaker.allow():
            return False
        code = grpc.StatusCode.OK
        try:
            reply = await self.stub.ModelReady(probe, timeout=timeout, metadata=outgoing())
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            return False
        finally:
            breaker.record(code)
            UPSTREAM_CALLS(self.name, code.name).inc()
        return reply.ready

    async def close(self) -> None:
        """End its lanes and close its channels."""
        for lanes in self.lanes.values():
            lanes.close()
        for channel in [self.channel, *self._replicas]:
            await channel.close()


def _ready(channel: grpc.aio.Channel) -> bool:
    return channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY


ProcessHop = Hop[ProcessStub, v1.ProcessRequest, v1.ProcessResponse, v1.ProcessResponse]
InferenceHop = Hop[
    InferenceStub, v2.ModelInferRequest, v2.ModelStreamInferResponse, v2.ModelInferResponse
]


def open_hop(
    name: str,
    endpoint: ServiceEndpoint,
    stub: Callable[[grpc.aio.Channel], Stub],
    service: str,
    settings: Settings,
    streams: Mapping[str, Callable[[Stub], StreamMethod[Request, Answer, Reply]]] | None = None,
    slabs: HopSlabs[Request, Reply] | None = None,
    held: int = 0,
) -> Hop[Stub, Request, Answer, Reply]:
    """A hop to `endpoint`, over a channel with the deployment's server and TLS settings
    that balances over its replicas (unary calls, retries), and where it lists several local
    replicas, a channel to each for its lanes, each sent at most `held` messages at once
    (0: no bound)."""

    def dial(address: str) -> grpc.aio.Channel:
        return open_channel(
            address, settings.server, [service], settings.tls, settings.gateway.reconnect_seconds
        )

    # Lanes turn over well before the server ages their connection out, and often enough
    # that round-robin soon spreads them over replicas that were not ready at the start.
    lifetime = min(settings.server.max_connection_age_seconds / 2, LANE_SECONDS)
    # A dns: target may resolve to several replicas; a single local address is one.
    replicated = endpoint.replicas > 1 or endpoint.target is not None
    known = endpoint.listens if endpoint.replicas > 1 and endpoint.target is None else []
    replicas = [dial(listen) for listen in known] if streams else []
    addresses = known or [endpoint.address]
    pipes = Pipes(settings.server.pipes, settings.server.max_message_bytes)

    def piped(
        method: StreamMethod[Request, Answer, Reply], index: int
    ) -> StreamMethod[Request, Answer, Reply]:
        return pipes.lanes_to(method, name, service, addresses[index])

    return Hop(
        name,
        dial(endpoint.address),
        stub,
        settings.gateway,
        replicated,
        streams,
        lifetime,
        replicas,
        slabs,
        held,
        piped,
    )


class Sent:
    """When an attempt left for its replica: after any wait in the gateway for a replica with
    room (lanes.py's Spread), which says nothing of the replica, so the hop's timer, which
    sets its own timeouts from the replicas' recent P99, never counts it."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def now(self) -> None:
        self.at = time.monotonic()


class Upstreams:
    """Preprocess, every inference deployment, and postprocess."""

    def __init__(self, settings: Settings) -> None:
        services = settings.services
        slab = settings.server.slab
        # Where big inputs go to preprocess and inference of this host (upstream/slabs.py).
        self._slab = open_slab(slab, "gateway")
        # Preprocess's crops, passed on to inference by ref; the flights release them.
        self.passed = Passed(slab.root) if slab.enabled else None
        self.preprocess: ProcessHop = open_hop(
            "preprocess",
            services.preprocess,
            preprocess_pb2_grpc.PreprocessStub,
            "strata.v1.Preprocess",
            settings,
            {"Process": process_stream},
            ProcessSlabs("preprocess", self.passed, self._slab) if self.passed else None,
            settings.gateway.replica_messages,
        )
        self.postprocess: ProcessHop = open_hop(
            "postprocess",
            services.postprocess,
            postprocess_pb2_grpc.PostprocessStub,
            "strata.v1.Postprocess",
            settings,
            {"Process": process_stream},
            held=settings.gateway.replica_messages,
        )
        self._settings = settings
        self.inference = {
            name: self._inference(name, endpoint) for name, endpoint in services.inference.items()
        }
        self._replicas: dict[str, InferenceHop] = {}  # a sequence's one replica, by its address

    def _inference(self, name: str, endpoint: ServiceEndpoint) -> InferenceHop:
        # No bound on the messages a replica holds: its batcher makes one batch of them.
        return open_hop(
            f"inference-{name}",
            endpoint,
            v2_grpc.GRPCInferenceServiceStub,
            INFERENCE_SERVICE,
            self._settings,
            {"ModelInfer": infer_stream},
            InferenceSlabs(self.passed, self._slab) if self.passed else None,
        )

    def inference_hop(self, deployment: str, sequence: Flags | None = None) -> InferenceHop:
        """The hop to `deployment`; for a request of a sequence, to the one replica that
        holds it, among those its endpoint lists (upstream/sequences.py). An endpoint
        reached through a `target` is one hop: its name must lead to one replica."""
        endpoint = self._settings.services.inference[deployment]
        if sequence is None or endpoint.target or endpoint.replicas == 1:
            return self.inference[deployment]
        listen = endpoint.listens[replica(sequence, endpoint.replicas)]
        hop = self._replicas.get(listen)
        if hop is None:
            one = endpoint.model_copy(update={"listen": listen, "replicas": 1})
            hop = self._replicas[listen] = self._inference(deployment, one)
        return hop

    @property
    def message_limit(self) -> int:
        """The most bytes one message between the layers may carry."""
        return self._settings.server.max_message_bytes

    async def batch_limit(self, deployment: str, model: str, version: str) -> int | None:
        """The most rows `model` takes in one batch on `deployment` (v2 ModelConfig's
        max_batch_size; 0: no batch dimension); None where the server does not say."""
        hop = self.inference[deployment]
        request = v2.ModelConfigRequest(name=model, version=version)
        try:
            # No trace context: the question is no request's work.
            reply = await hop.stub.ModelConfig(request, timeout=READY_PROBE_SECONDS)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in UNSAID:
                return None
            raise from_code(exc.code(), f"{hop.name}: {exc.details()}") from None
        return reply.config.max_batch_size

    def configure(self, gateway: GatewaySettings) -> None:
        """New breaker thresholds and hop timeouts on every hop (sequences' too), live."""
        self._settings = self._settings.model_copy(update={"gateway": gateway})
        for hop in [*self.hops, *self._replicas.values()]:
            hop.configure(gateway)

    @property
    def hops(self) -> list[ProcessHop | InferenceHop]:
        return [self.preprocess, *self.inference.values(), self.postprocess]

    async def healthy(self, timeout: float = 1.0) -> dict[str, bool]:
        """Whether each upstream's health service answers SERVING."""
        states = await asyncio.gather(*(hop.healthy(timeout) for hop in self.hops))
        return {hop.name: state for hop, state in zip(self.hops, states, strict=True)}

    async def close(self) -> None:
        for hop in [*self.hops, *self._replicas.values()]:
            await hop.close()
        if self._slab is not None:
            self._slab.close()
