"""How flights form at the gateway (services/gateway/flow/flights.py): alone when idle, together
under load, bounded, grouped by key, and never carrying a request whose caller has gone."""

import asyncio
import functools

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from services.gateway.flow.flights import Flights, Member
from services.gateway.flow.sizing import Room
from strata.config.gateway import FlightSettings
from strata.errors import DeadlineExceeded
from strata.wire.deadline import Deadline


def run(test):
    """Run an async test on a fresh event loop."""

    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


class Recorder:
    """A chain that answers each member with its request, after being released."""

    def __init__(self) -> None:
        self.flights: list[list[str]] = []
        self.waited: dict[str, float] = {}
        self.release = asyncio.Event()
        self.release.set()

    def departed(self, member: Member, waited: float) -> None:
        self.waited[member.request] = waited

    def flights_with(self, settings: FlightSettings) -> Flights:
        return Flights(settings, self.fly, self.departed)

    async def fly(self, members: list[Member]) -> None:
        self.flights.append([m.request for m in members])
        await self.release.wait()
        for member in members:
            if member.waiting:
                member.future.set_result(member.request)


def member(name: str, rows: int = 1, seconds: float = 5.0) -> Member:
    return Member(name, rows, Deadline.after(seconds))


async def until(condition, seconds: float = 2.0) -> None:
    for _ in range(int(seconds / 0.001)):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")


async def held(flights: Flights, chain: Recorder, key: str = "k") -> asyncio.Task:
    """A first request whose flight stays in the air until `chain.release` is set."""
    chain.release.clear()
    task = asyncio.create_task(flights.board(key, member("first")))
    await until(lambda: chain.flights)
    return task


@run
async def test_a_lone_request_leaves_at_once_alone() -> None:
    chain = Recorder()
    flights = Flights(FlightSettings(max_in_air=4), chain.fly, chain.departed)
    answer = await asyncio.wait_for(flights.board("k", member("one")), 0.5)
    assert answer == "one" and chain.flights == [["one"]]


@run
async def test_requests_queued_under_load_leave_together_within_bounds() -> None:
    chain = Recorder()
    flights = Flights(
        FlightSettings(max_in_air=1, max_requests=3, max_rows=100), chain.fly, chain.departed
    )
    first = await held(flights, chain)
    waiting = [asyncio.create_task(flights.board("k", member(f"r{i}"))) for i in range(5)]
    await asyncio.sleep(0.01)
    assert chain.flights == [["first"]], "nothing leaves while the one flight is in the air"
    chain.release.set()
    assert await asyncio.gather(first, *waiting) == ["first", *(f"r{i}" for i in range(5))]
    assert chain.flights[1:] == [["r0", "r1", "r2"], ["r3", "r4"]]
    assert chain.waited["first"] < 0.005 < min(chain.waited[f"r{i}"] for i in range(5))


@run
async def test_a_flight_carries_at_most_max_rows() -> None:
    chain = Recorder()
    flights = Flights(
        FlightSettings(max_in_air=1, max_requests=10, max_rows=4), chain.fly, chain.departed
    )
    first = await held(flights, chain)
    sizes = [3, 1, 2, 2]
    waiting = [
        asyncio.create_task(flights.board("k", member(f"r{i}", rows)))
        for i, rows in enumerate(sizes)
    ]
    await asyncio.sleep(0.01)
    chain.release.set()
    await asyncio.gather(first, *waiting)
    assert chain.flights[1:] == [["r0", "r1"], ["r2", "r3"]]


@run
async def test_a_flight_takes_no_more_than_its_room_and_the_rest_take_the_next() -> None:
    chain = Recorder()
    room = Room(rows=3, message_bytes=1_000, row_bytes=300.0)  # 3 rows by their answers' bytes
    flights = Flights(FlightSettings(max_in_air=1), chain.fly, chain.departed, lambda m: room)
    first = await held(flights, chain)
    waiting = [
        asyncio.create_task(flights.board("k", Member(f"r{i}", 1, Deadline.after(5), size=10)))
        for i in range(5)
    ]
    big = Member("big", 1, Deadline.after(5), size=2_000)  # its inputs alone pass the bytes
    waiting.append(asyncio.create_task(flights.board("k", big)))
    await asyncio.sleep(0.01)
    chain.release.set()
    assert await asyncio.gather(*waiting) == [*(f"r{i}" for i in range(5)), "big"]
    await first
    assert chain.flights[1:] == [["r0", "r1", "r2"], ["r3", "r4"], ["big"]]


@run
async def test_requests_that_must_not_share_never_share_a_flight() -> None:
    chain = Recorder()
    flights = Flights(FlightSettings(max_in_air=1), chain.fly, chain.departed)
    first = await held(flights, chain)
    waiting = [
        asyncio.create_task(flights.board(key, member(f"{key}{i}")))
        for i in range(2)
        for key in ("a", "b")
    ]
    await asyncio.sleep(0.01)
    chain.release.set()
    await asyncio.gather(first, *waiting)
    assert sorted(chain.flights[1:]) == [["a0", "a1"], ["b0", "b1"]]


@run
async def test_a_request_whose_deadline_passes_in_the_queue_is_not_carried() -> None:
    chain = Recorder()
    flights = Flights(FlightSettings(max_in_air=1), chain.fly, chain.departed)
    first = await held(flights, chain)
    late = asyncio.create_task(flights.board("k", member("late", seconds=0.02)))
    kept = asyncio.create_task(flights.board("k", member("kept")))
    with pytest.raises(DeadlineExceeded):
        await late
    chain.release.set()
    assert await asyncio.gather(first, kept) == ["first", "kept"]
    assert chain.flights[1:] == [["kept"]]


@run
async def test_a_request_whose_caller_gave_up_is_not_carried() -> None:
    chain = Recorder()
    flights = Flights(FlightSettings(max_in_air=1), chain.fly, chain.departed)
    first = await held(flights, chain)
    gone = asyncio.create_task(flights.board("k", member("gone")))
    kept = asyncio.create_task(flights.board("k", member("kept")))
    await asyncio.sleep(0.01)
    gone.cancel()
    chain.release.set()
    assert await asyncio.gather(first, kept) == ["first", "kept"]
    assert chain.flights[1:] == [["kept"]]


@run
async def test_a_failing_flight_fails_each_of_its_members_and_nothing_else() -> None:
    async def broken(members: list[Member]) -> None:
        raise RuntimeError("the chain broke")

    flights = Flights(FlightSettings(max_in_air=2), broken, lambda member, waited: None)
    results = await asyncio.gather(
        *(flights.board("k", member(f"r{i}")) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    assert REGISTRY.get_sample_value("strata_gateway_flights_in_air") == 0


@run
async def test_a_flight_of_several_flies_in_its_leads_trace_and_the_others_link_to_it() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    spans = [tracer.start_span(f"request {i}") for i in range(2)]
    unsampled = trace.NonRecordingSpan(spans[0].get_span_context())
    contexts = [trace.set_span_in_context(s) for s in (unsampled, *spans)]
    seen: list[trace.Span] = []

    chain = Recorder()

    async def fly(members: list[Member]) -> None:
        seen.append(trace.get_current_span())
        await chain.fly(members)

    flights = Flights(FlightSettings(), fly, chain.departed)
    held_back = await held(flights, chain)  # the next three then leave together
    boarding = [
        asyncio.create_task(flights.board("k", Member(f"m{i}", 1, Deadline.after(5), c)))
        for i, c in enumerate(contexts)
    ]
    chain.release.set()
    await asyncio.gather(held_back, *boarding)
    lead, follower = spans
    assert seen[1:] == [lead], "the flight's calls are made in its first sampled member's trace"
    assert lead.attributes["strata.flight_requests"] == 3 and "strata.flight" in lead.attributes
    assert [link.context for link in follower.links] == [lead.get_span_context()]
    assert lead.is_recording(), "the lead's span is its request's, ended by its request"
    assert not exporter.get_finished_spans(), "no span of the flight's own"


class Gates:
    """A chain whose flights each land when the test opens their gate."""

    def __init__(self) -> None:
        self.flights: list[list[str]] = []
        self._gates: list[asyncio.Event] = []

    async def fly(self, members: list[Member]) -> None:
        self.flights.append([m.request for m in members])
        gate = asyncio.Event()
        self._gates.append(gate)
        await gate.wait()
        for member in members:
            if member.waiting:
                member.future.set_result(member.request)

    def land(self, flight: int) -> None:
        self._gates[flight].set()


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


AIR = 1.0  # seconds the first flight of `busy` is in the air: a gathering flight waits 0.5 s


async def busy(flights: Flights, gates: Gates, load: int) -> list[asyncio.Task]:
    """Two flights of `load` / 2 in the air, the first landed once after AIR seconds: the key's
    load is `load` and one flight of it is in the air; the rest's requests then board again."""
    boarded = [asyncio.create_task(flights.board("k", member(f"a{i}"))) for i in range(load // 2)]
    await turns()
    boarded += [asyncio.create_task(flights.board("k", member(f"b{i}"))) for i in range(load // 2)]
    await turns()
    assert len(gates.flights) == 2, "with no landing seen yet, a flight leaves when a slot frees"
    await asyncio.sleep(AIR)
    gates.land(0)  # the key had `load` requests in the system as it landed
    await turns()
    return boarded


@run
async def test_a_request_sent_again_from_a_landed_flight_waits_for_its_share_of_the_load() -> None:
    gates = Gates()
    flights = Flights(FlightSettings(max_in_air=2), gates.fly, lambda member, waited: None)
    boarded = await busy(flights, gates, load=16)
    again = []
    for i in range(8):  # the landed flight's clients send again, one event-loop turn apart
        assert len(gates.flights) == 2, f"{i} gathered of a share of 8: they wait"
        again.append(asyncio.create_task(flights.board("k", member(f"c{i}"))))
        await turns()
    assert gates.flights[2] == [f"c{i}" for i in range(8)], "the 8th fills the share: it leaves"
    gates.land(1)
    gates.land(2)
    await asyncio.gather(*boarded, *again)


@run
async def test_a_gathering_flight_leaves_when_the_keys_flights_have_landed() -> None:
    gates = Gates()
    flights = Flights(FlightSettings(max_in_air=2), gates.fly, lambda member, waited: None)
    boarded = await busy(flights, gates, load=16)
    lone = asyncio.create_task(flights.board("k", member("lone")))
    await turns()
    assert len(gates.flights) == 2
    gates.land(1)  # nothing of the key in the air: it is calm, and what gathered leaves
    await turns()
    assert gates.flights[2] == ["lone"]
    gates.land(2)
    await asyncio.gather(*boarded, lone)


@run
async def test_a_gathering_flight_waits_for_its_share_at_most_its_linger() -> None:
    gates = Gates()
    flights = Flights(FlightSettings(max_in_air=2), gates.fly, lambda member, waited: None)
    boarded = await busy(flights, gates, load=16)
    lone = asyncio.create_task(flights.board("k", member("lone")))
    await asyncio.sleep(AIR / 10)
    assert len(gates.flights) == 2, "it waits for company"
    await until(lambda: len(gates.flights) == 3)
    assert gates.flights[2] == ["lone"], "it leaves alone, the flight before it still in the air"
    gates.land(1)
    gates.land(2)
    await asyncio.gather(*boarded, lone)


@run
async def test_with_no_linger_a_request_leaves_whenever_a_slot_is_free() -> None:
    gates = Gates()
    flights = Flights(FlightSettings(max_in_air=2, linger=0), gates.fly, lambda m, w: None)
    boarded = await busy(flights, gates, load=16)
    lone = asyncio.create_task(flights.board("k", member("lone")))
    await turns()
    assert gates.flights[2] == ["lone"]
    gates.land(1)
    gates.land(2)
    await asyncio.gather(*boarded, lone)


@run
async def test_a_full_flight_leaves_below_its_share() -> None:
    gates = Gates()
    settings = FlightSettings(max_in_air=2, max_rows=4)
    flights = Flights(settings, gates.fly, lambda member, waited: None)
    boarded = [asyncio.create_task(flights.board("k", member(f"a{i}"))) for i in range(8)]
    await turns()
    assert gates.flights == [["a0", "a1", "a2", "a3"], ["a4", "a5", "a6", "a7"]]
    await asyncio.sleep(AIR)
    gates.land(0)  # 8 in the system as it landed: a share of 4
    await turns()
    boarded += [asyncio.create_task(flights.board("k", member(n, 3))) for n in ("big", "next")]
    await turns()
    assert gates.flights[2] == ["big"], "3 rows and the next 3 pass max_rows: it is full"
    for flight in (1, 2):
        gates.land(flight)
    await until(lambda: len(gates.flights) == 4)
    gates.land(3)
    await asyncio.gather(*boarded)


@run
async def test_another_keys_lone_request_leaves_at_once_while_one_key_gathers() -> None:
    gates = Gates()
    flights = Flights(FlightSettings(max_in_air=2), gates.fly, lambda member, waited: None)
    boarded = await busy(flights, gates, load=16)
    waits = asyncio.create_task(flights.board("k", member("waits")))
    other = asyncio.create_task(flights.board("j", member("other")))
    await turns()
    assert gates.flights[2:] == [["other"]], "key j is calm; key k gathers its share"
    gates.land(1)
    gates.land(2)
    await until(lambda: len(gates.flights) == 4)
    gates.land(3)
    await asyncio.gather(*boarded, waits, other)


@run
async def test_a_pipelines_own_max_in_air_lets_its_flight_leave_beside_more() -> None:
    gates = Gates()
    settings = FlightSettings(max_in_air=2, linger=0)

    def most(member: Member) -> int | None:  # key p's pipeline sets 3; key d's sets none
        return 3 if member.request.startswith("p") else None

    flights = Flights(settings, gates.fly, lambda m, w: None, most=most)
    boarded = []
    for name in ("p0", "d0", "p1"):
        boarded.append(asyncio.create_task(flights.board(name[0], member(name))))
        await turns()
    assert gates.flights == [["p0"], ["d0"], ["p1"]], "p's second flight leaves beside two"
    boarded.append(asyncio.create_task(flights.board("d", member("d1"))))
    await turns()
    assert len(gates.flights) == 3, "d keeps the gateway's 2: it waits"
    gates.land(0)
    await turns()
    assert len(gates.flights) == 3, "still two in the air"
    gates.land(1)
    await until(lambda: len(gates.flights) == 4)
    assert gates.flights[3] == ["d1"]
    gates.land(2)
    gates.land(3)
    await asyncio.gather(*boarded)
