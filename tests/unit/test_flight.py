"""A flight's members as one v2 request's parameters: written by the gateway, read by
inference, each member's own deadline among them."""

from __future__ import annotations

import pytest

from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import flight
from strata.wire.deadline import Deadline


def test_members_read_back_what_was_written_their_own_deadlines_included() -> None:
    sent = [
        flight.FlightMember(1, "00-aa-bb-01", Deadline.after(5.0)),
        flight.FlightMember(2, "", None),
        flight.FlightMember(3, "", Deadline.after(0.2)),
    ]
    request = v2.ModelInferRequest()
    flight.set_members(request.parameters, sent)
    assert request.parameters[flight.TIMEOUTS].string_param.split(",")[1] == "0"
    received = flight.members(request.parameters, total_rows=6)
    assert [(m.rows, m.traceparent) for m in received] == [(1, "00-aa-bb-01"), (2, ""), (3, "")]
    assert received[1].deadline is None
    for before, after in ((sent[0], received[0]), (sent[2], received[2])):
        assert before.deadline is not None and after.deadline is not None
        assert after.deadline.at == pytest.approx(before.deadline.at, abs=0.005)


def test_a_flight_without_deadlines_has_members_without_their_own() -> None:
    request = v2.ModelInferRequest()
    request.parameters[flight.ROWS].string_param = "1,1"
    assert [m.deadline for m in flight.members(request.parameters, total_rows=2)] == [None, None]


def test_a_deadline_for_each_member_or_none_at_all() -> None:
    request = v2.ModelInferRequest()
    request.parameters[flight.ROWS].string_param = "1,1"
    request.parameters[flight.TIMEOUTS].string_param = "5000"
    with pytest.raises(InvalidArgument, match="1 entries for 2 members"):
        flight.members(request.parameters, total_rows=2)
