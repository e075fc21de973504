"""Good requests that travel with bad ones get exactly the answer they get alone, at every
layer: concurrent client requests the gateway carries as flights, a ModelInfer flight whose
members' deadlines have passed, and preprocess and postprocess flights with malformed members
beside a malformed plain item. A bad one is refused with a client's error, or (finite but
huge values) answered OK with finite numbers only."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import Supervisor
from strata.wire import codec
from strata.wire.flight import ROWS, TIMEOUTS, TRACE_CONTEXTS, member_errors
from tests.support.flight_requests import alone, by_member, flight
from tests.support.hostile import (
    CLIENT,
    FINDINGS,
    REFUSED,
    S,
    answer,
    finite,
    item_outcomes,
)
from tests.support.ports import INPUTS, assert_serving, kind, ports, stub_for
from tests.support.results import raise_for_result
from tests.support.system import ROOT

# Every attack is judged by how late an honest request meanwhile is: run alone.
pytestmark = pytest.mark.timing

CLIENT_ID = (("x-client-id", "hostile-flights"),)  # one client: one A/B arm, one flight key


def client_data(pipeline: str) -> np.ndarray:
    with np.load(ROOT / "build" / "data" / f"{pipeline}_test.npz") as data:
        return data["features" if pipeline == "tabular" else "images"][:12]


def flown(system: Supervisor) -> tuple[float, float]:
    """(flights, client requests they carried) so far, from the gateway's metrics."""
    address = system.settings.services.gateway.metrics
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as page:
        text = page.read().decode()
    families = text_string_to_metric_families(text)
    (family,) = (f for f in families if f.name == "strata_gateway_flight_requests")
    samples = {s.name.rsplit("_", 1)[-1]: s.value for s in family.samples}
    return samples["count"], samples["sum"]


# pipeline -> a bad request of the same row shape as the good ones, and its client timeout:
# for tabular, finite features too large to standardise; for digits, a caller that gives up.
BAD: dict[str, tuple[Callable[[int], np.ndarray], float]] = {
    "tabular": (lambda i: np.full((1, 30), (-1) ** i * 3.4e38, np.float32), 15.0),
    "digits": (lambda i: np.full((1, 8, 8), i, np.uint8), 0.002),
}


@pytest.mark.parametrize("pipeline", ["tabular", "digits"])
def test_good_requests_flying_with_bad_ones_get_their_answers(
    system: Supervisor, channels: dict, pipeline: str
) -> None:
    stub = stub_for(channels["gateway"], "gateway")
    name = INPUTS["gateway"][pipeline]
    goods = [codec.build_request(pipeline, {name: row[None]}) for row in client_data(pipeline)]
    expected = [
        codec.response_outputs(stub.ModelInfer(r, timeout=15, metadata=CLIENT_ID)) for r in goods
    ]
    make_bad, timeout = BAD[pipeline]
    before = flown(system)
    for _ in range(3):
        sent = []
        for i, good in enumerate(goods):
            bad = codec.build_request(pipeline, {name: make_bad(i)})
            sent.append(stub.ModelInfer.future(good, timeout=15, metadata=CLIENT_ID))
            sent.append(stub.ModelInfer.future(bad, timeout=timeout, metadata=CLIENT_ID))
        for i, reference in enumerate(expected):
            reply, _ = answer(sent[2 * i].result, {S.OK})
            outputs = codec.response_outputs(reply)
            assert outputs.keys() == reference.keys()
            for key, array in reference.items():
                np.testing.assert_array_equal(outputs[key], array, err_msg=f"request {i}: {key}")
        for bad in sent[1::2]:
            reply, _ = answer(bad.result, CLIENT | {S.DEADLINE_EXCEEDED})
            assert reply is None or finite(codec.response_outputs(reply)), "OK with NaN scores"
    flights, carried = (after - start for after, start in zip(flown(system), before, strict=True))
    assert carried > flights, "no flight carried more than one request: nothing was tested"
    assert_serving(system)


@pytest.mark.parametrize("port", ports("inference"))
def test_inference_flight_members_past_their_deadline_fail_alone(
    system: Supervisor, channels: dict, port: str
) -> None:
    stub = stub_for(channels[port], port)
    rng = np.random.default_rng(7)
    members = [rng.random((rows, 64), dtype=np.float32) for rows in (1, 2, 1, 3)]
    requests = [codec.build_request("digits", {"pixels": m}) for m in members]
    alone_logits = [codec.response_outputs(stub.ModelInfer(r, timeout=15)) for r in requests]
    request = codec.build_request("digits", {"pixels": np.concatenate(members)})
    parameters = request.parameters
    parameters[ROWS].string_param = "1,2,1,3"
    parameters[TIMEOUTS].string_param = "10000000,1,10000000,1"  # µs: members 1 and 3 expire
    parameters[TRACE_CONTEXTS].string_param = "not a traceparent,,00-zz-zz-01,"
    reply, _ = answer(lambda: stub.ModelInfer(request, timeout=15), {S.OK})
    errors = member_errors(reply.parameters, len(members))
    assert sorted(errors) == [1, 3], errors
    for error in errors.values():
        assert error.code == S.DEADLINE_EXCEEDED and str(error), error
    expected = np.concatenate([alone_logits[0]["logits"], alone_logits[2]["logits"]])
    np.testing.assert_array_equal(codec.response_outputs(reply)["logits"], expected)
    assert_serving(system)


def rows(pipeline: str, port: str, count: int, fill: float | None = None) -> codec.Arrays:
    """`count` rows of `pipeline`'s input at `port`, random, or all `fill`."""
    rng = np.random.default_rng(count)
    if kind(port) == "postprocess":
        array = rng.normal(size=(count, 10 if pipeline == "digits" else 2)).astype(np.float32)
    elif pipeline == "digits":
        array = rng.integers(0, 256, (count, 12, 12), dtype=np.uint8)
    else:
        array = (client_data("tabular")[:1] * rng.uniform(0.9, 1.1, (count, 30))).astype(np.float32)
    if fill is not None:
        array = np.full_like(array, fill)
    return {INPUTS[kind(port)][pipeline]: array}


# Members by id; "refused-*" ones must be refused, other bad ones at least never OK with NaN.
MEMBERS = {
    ("preprocess", "tabular"): {
        "good-0": (2, None),
        "refused-nan": (1, np.nan),
        "good-1": (1, None),
        "refused-inf": (1, np.inf),
        "huge": (1, 3.4e38),
    },
    ("preprocess", "digits"): {
        "good-0": (1, None),
        "refused-65-rows": (65, None),  # beyond the pipeline's max_batch_size
        "good-1": (2, None),
    },
    ("postprocess", "digits"): {
        "good-0": (2, None),
        "nan": (1, np.nan),
        "good-1": (1, None),
        "-inf": (1, -np.inf),
    },
}
MEMBERS[("postprocess", "tabular")] = MEMBERS[("postprocess", "digits")]
CASES = [(p, name) for p in ports("preprocess", "postprocess") for name in ("digits", "tabular")]


def outcomes(request: v1.ProcessRequest, reply: v1.ProcessResponse, index: int) -> list[S]:
    """The outcomes of item `index` (checked as `item_outcomes` does)."""
    (codes,) = item_outcomes(
        v1.ProcessRequest(requests=[request.requests[index]]),
        v1.ProcessResponse(results=[reply.results[index]]),
    )
    return codes


@pytest.mark.parametrize(("port", "pipeline"), CASES)
def test_process_flight_members_fail_alone(
    system: Supervisor, channels: dict, port: str, pipeline: str
) -> None:
    stub = stub_for(channels[port], port)
    members = {
        rid: rows(pipeline, port, count, fill)
        for rid, (count, fill) in MEMBERS[(kind(port), pipeline)].items()
    }
    goods = {rid: arrays for rid, arrays in members.items() if rid.startswith("good")}
    separate = stub.Process(v1.ProcessRequest(requests=alone(pipeline, goods)), timeout=15)
    hostile = v1.Request(
        id="hostile",
        pipeline=pipeline,
        tensors=[FINDINGS[1].tensor(INPUTS[kind(port)][pipeline])],
    )
    request = v1.ProcessRequest(requests=[flight(pipeline, members), hostile])
    reply, _ = answer(lambda: stub.Process(request, timeout=15), {S.OK})
    answers = by_member(reply.results[0])
    for result in separate.results:
        expected = raise_for_result(result)
        assert answers[result.id].keys() == expected.keys()
        for key, array in expected.items():
            np.testing.assert_array_equal(answers[result.id][key], array, err_msg=result.id)
    codes = outcomes(request, reply, 0)
    for rid, code in zip(members, codes, strict=True):
        if rid.startswith("refused"):
            assert code in REFUSED, rid
        elif not rid.startswith("good"):
            assert code != S.OK or finite(answers[rid]), f"{rid}: OK with NaN or infinities"
    assert outcomes(request, reply, 1)[0] in REFUSED
    assert_serving(system)
