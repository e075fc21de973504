"""Hostile strata.v1 Process calls at each preprocess replica and at postprocess, while a good
request to the same port keeps its normal latency: any pipelines, tensors, parameters, trace
contexts and flight members. The call is always answered, each item on its own with OK or a
client's error with a message, and the good item that travels with them gets exactly the
answer it gets alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import Supervisor
from tests.support.hostile import S, answer, item_outcomes, process_requests, share
from tests.support.ports import good_item, kind, ports, stub_for, watched

# Every attack is judged by how late an honest request meanwhile is: run alone.
pytestmark = pytest.mark.timing

TENSORS = {
    "preprocess": ["images", "features", "text"],
    "postprocess": ["logits", "probabilities"],
}


@pytest.mark.parametrize("port", ports("preprocess", "postprocess"))
def test_hostile_process_calls(system: Supervisor, channels: dict, port: str) -> None:
    stub = stub_for(channels[port], port)
    good = good_item(port)
    (alone,) = stub.Process(v1.ProcessRequest(requests=[good]), timeout=15).results

    @share(0.4)
    @given(items=process_requests(["digits", "tabular"], TENSORS[kind(port)]), at=st.integers(0, 3))
    def hostile(items: list[v1.Request], at: int) -> None:
        at = min(at, len(items))
        request = v1.ProcessRequest(requests=[*items[:at], good, *items[at:]])
        reply, _ = answer(lambda: stub.Process(request, timeout=15), {S.OK})  # the call: always
        item_outcomes(request, reply)
        assert reply.results[at] == alone, "the good item's answer changed"

    with watched(system, channels[port], port):
        hostile()
