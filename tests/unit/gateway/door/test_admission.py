"""The door's one place (services/gateway/door/admission.py): the policies asked in order at
their own checkpoint, a refusal giving back what the policies before it handed out."""

import asyncio

import pytest

from services.gateway.door.admission import Admission
from services.gateway.door.concurrency import AdaptiveLimits, ChainLimit
from services.gateway.door.identity import Identity
from services.gateway.door.ladder import LadderController
from services.gateway.door.policy import Checkpoint, Entry, Ticket
from services.gateway.door.rate_limits import RateLimit
from services.gateway.metrics import REFUSALS
from services.gateway.request import Caller
from strata.config import load_settings
from strata.config.gateway import Concurrency, Ladder, RateLimits, TokenBucket
from strata.config.settings import Settings
from strata.errors import Overloaded, PermissionDenied
from strata.wire.deadline import Deadline
from tests.support.system import DEFAULT_CONFIG


class Refusing:
    """A policy that refuses every request at boarding."""

    checkpoint = Checkpoint.BOARDING

    async def admit(self, entry: Entry) -> Ticket:
        raise PermissionDenied(f"{entry.client} may not")

    def leave(self, ticket: Ticket, telling: bool) -> None:
        raise AssertionError("a refusal holds no ticket")

    def configure(self, settings: Settings) -> None:
        return None


def entry(client: str = "id:c") -> Entry:
    caller = Caller({}, "ipv4:127.0.0.1:5000", None)
    return Entry(caller, "digits", client, "", Deadline.after(5.0))


def door(*later) -> tuple[Admission, AdaptiveLimits]:
    settings = load_settings(DEFAULT_CONFIG)
    limits = AdaptiveLimits(Concurrency(initial=1, min_limit=1, contention=1.0), {"digits": 1.0})
    ladder = LadderController(Ladder(), {"digits": 1.0}, lambda *_: None)
    policies = [
        RateLimit(settings, limits.refusals),
        ChainLimit(limits, ladder, lambda: 0.0),
        *later,
    ]
    return Admission(Identity(settings), policies), limits


def test_each_checkpoint_asks_only_its_own_policies() -> None:
    admission, limits = door()
    arrived = asyncio.run(admission.admit(entry(), Checkpoint.ARRIVAL))
    assert [type(p) for p, _ in arrived.tickets] == [RateLimit]
    assert limits.limits["digits"].inflight == 0, "the adaptive limit is asked on boarding"
    boarded = asyncio.run(admission.admit(entry(), Checkpoint.BOARDING))
    assert limits.limits["digits"].inflight == 1
    admission.leave(boarded, telling=False)
    assert limits.limits["digits"].inflight == 0


def test_a_refusal_gives_back_the_tickets_handed_out_before_it() -> None:
    admission, limits = door(Refusing())
    with pytest.raises(PermissionDenied, match="id:c may not"):
        asyncio.run(admission.admit(entry(), Checkpoint.BOARDING))
    assert limits.limits["digits"].inflight == 0, "the adaptive limit's place is free again"
    assert limits.limits["digits"].holders == {}


def test_a_rate_limit_refusal_says_when_to_retry_and_is_counted_by_reason() -> None:
    loaded = load_settings(DEFAULT_CONFIG)
    limited = RateLimits(per_client=TokenBucket(rate=1, burst=1))
    gateway = loaded.gateway.model_copy(update={"rate_limits": limited})
    settings = loaded.model_copy(update={"gateway": gateway})
    limits = AdaptiveLimits(Concurrency(), {"digits": 1.0})
    admission = Admission(Identity(settings), [RateLimit(settings, limits.refusals)])
    asyncio.run(admission.admit(entry("id:eager"), Checkpoint.ARRIVAL))
    counted = REFUSALS("rate_limit_client", "id:eager")
    before = counted._value.get()
    with pytest.raises(Overloaded) as refused:
        asyncio.run(admission.admit(entry("id:eager"), Checkpoint.ARRIVAL))
    wait = refused.value.retry_after  # until the next token: a second, less what has passed
    assert 0.5 < wait <= 1.0
    assert f"rate limit (client) exceeded; retry in {wait:.3f}s" == str(refused.value)
    assert dict(refused.value.trailers()) == {"retry-after-ms": str(round(wait * 1000))}
    assert counted._value.get() == before + 1
