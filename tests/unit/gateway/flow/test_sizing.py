"""How big a flight may grow (services/gateway/flow/sizing.py): what its messages were seen to
weigh per row, the message limit less its margin, and the model's batch limit."""

import asyncio
import random

import pytest

from services.gateway.flow.sizing import RECENT, Arm, Heaviest, Room, Sizes, is_too_large
from strata.errors import InvalidArgument, Overloaded, Unavailable

ARM = Arm("images", "a", "vision", "1")
PHOTO = 602_112  # bytes of one photo's FP32 pixels
LIMIT = 16 * 1024 * 1024


def sizes_asked(batch: int | None = 16, margin: float = 0.1) -> Sizes:
    """Sizes whose model limit for ARM has been asked and answered `batch`."""

    async def batch_limit(deployment: str, model: str, version: str) -> int | None:
        assert (deployment, model, version) == ("a", "vision", "1")
        return batch

    async def asked() -> Sizes:
        sizes = Sizes(LIMIT, margin, batch_limit)
        sizes.room(ARM)
        for _ in range(3):  # the question is answered at once
            await asyncio.sleep(0)
        return sizes

    return asyncio.run(asked())


def test_a_flight_of_one_always_fits_and_of_more_only_once_its_rows_weigh_something() -> None:
    unknown = Room(16, LIMIT, None)
    assert unknown.fits(1, 1, 100)
    assert not unknown.fits(2, 2, 100), "nothing known yet: flights of one"


def test_a_flight_fits_while_its_rows_times_their_weight_stay_within_the_bytes() -> None:
    room = Room(64, 10 * PHOTO, PHOTO)
    assert room.fits(10, 10, 10 * 50_000)
    assert not room.fits(11, 11, 11 * 50_000), "the answer would not fit"
    assert not Room(64, 10 * PHOTO, 1.0).fits(2, 2, 10 * PHOTO + 1), "the inputs would not"
    assert not Room(8, LIMIT, 1.0).fits(9, 9, 9), "more than the model takes in a batch"


def test_until_the_model_says_its_batch_limit_flights_carry_one_request() -> None:
    async def never(deployment: str, model: str, version: str) -> int | None:
        await asyncio.sleep(10)
        return 16

    async def scenario() -> Room:
        sizes = Sizes(LIMIT, 0.1, never)
        room = sizes.room(ARM)
        await sizes.close()
        return room

    assert asyncio.run(scenario()) == Room(1, int(LIMIT * 0.9), None)


def test_the_room_is_the_limit_less_its_margin_over_the_heaviest_recent_row() -> None:
    sizes = sizes_asked(batch=16)
    assert sizes.room(ARM) == Room(16, int(LIMIT * 0.9), None)
    sizes.saw(ARM, 4, 4 * PHOTO)
    sizes.saw(ARM, 4, 4 * 4_000)  # the model's answer: lighter rows do not lower it
    room = sizes.room(ARM)
    assert room == Room(16, int(LIMIT * 0.9), PHOTO)
    assert room.fits(16, 16, 16 * 50_000)
    assert not Room(64, room.message_bytes, PHOTO).fits(28, 28, 28 * 50_000)


def test_a_model_that_does_not_say_its_batch_limit_leaves_rows_unbounded() -> None:
    sizes = sizes_asked(batch=None)
    sizes.saw(ARM, 1, 100)
    assert sizes.room(ARM).fits(1000, 1000, 1000)


def test_an_overflow_teaches_that_each_row_weighs_at_least_its_share_of_the_limit() -> None:
    sizes = sizes_asked()
    sizes.saw(ARM, 1, 1_000)
    sizes.overflowed(ARM, 4)
    assert sizes.room(ARM).row_bytes == pytest.approx((LIMIT + 1) / 4)


def test_a_request_too_large_alone_is_refused_naming_the_limit() -> None:
    sizes = sizes_asked()
    sizes.refuse_alone(ARM, 40, 40 * 50_000)  # nothing known of its answer yet: it goes
    sizes.saw(ARM, 1, PHOTO)
    sizes.refuse_alone(ARM, 27, 27 * 50_000)
    with pytest.raises(InvalidArgument, match=f"limit of {LIMIT} bytes.*max_message_bytes"):
        sizes.refuse_alone(ARM, 28, 28 * 50_000)
    with pytest.raises(InvalidArgument, match="max_message_bytes"):
        sizes.refuse_alone(ARM, 1, LIMIT + 1)


def test_only_grpc_s_message_limit_counts_as_too_large() -> None:
    message = "preprocess: SERVER: Sent message larger than max (16859285 vs. 16777216)"
    assert is_too_large(Overloaded(message))
    assert not is_too_large(Overloaded("pipeline 'images': the gateway is shedding load"))
    assert not is_too_large(Unavailable(message))


def test_an_overflow_sizes_flights_but_refuses_no_request_it_did_not_measure() -> None:
    sizes = sizes_asked()
    sizes.saw(ARM, 1, 1_000)
    sizes.overflowed(ARM, 4)  # one heavy row among four, perhaps
    sizes.refuse_alone(ARM, 16, 16 * 1_000)


def test_the_heaviest_row_is_that_of_the_last_messages_only_measured_ones_apart() -> None:
    heaviest, seen = Heaviest(), []
    assert (heaviest.largest, heaviest.measured) == (None, 0.0)
    draw = random.Random(46)
    for _ in range(4 * RECENT):  # each window's maximum comes, stays a while, and expires
        weight, measured = draw.random(), draw.random() < 0.8
        heaviest.add(weight, measured)
        seen.append((weight, measured))
        recent = seen[-RECENT:]
        assert heaviest.largest == max(w for w, _ in recent)
        assert heaviest.measured == max((w for w, m in recent if m), default=0.0)
