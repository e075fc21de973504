"""A later stage of a cascade may have a shadow, as the first model may: the rows the stage
ran (only those that took its branch, as its arm got them) are mirrored to another
deployment off the request's path, and the mirror's answers compared with the stage's and
counted under `<pipeline>/<stage>`; the admin status and the repository index show it, and a
hung shadow deployment costs the client nothing. Through the real chain, with every service
a process."""

import copy
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import yaml

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.e2e.default_system.test_stages import BUILD, cascade, logits
from tests.e2e.test_metrics import metrics_address, scrape, total
from tests.support.system import DEFAULT_CONFIG, running_system

TOKEN = "stage-shadow-admin-token-of-32-chars"
MODELS_TOKEN = "stage-shadow-models-token-of-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
UNSURE = 0.8  # the default cascade's bound
SHADOW = ("strata_gateway_shadow_comparisons", "strata_gateway_shadow_comparisons_total")
HUNG_TIMEOUT = 5.0  # the client's budget while the shadow's deployment is hung


def pipelines() -> dict:
    """`mirrored`: the default cascade whose large stage is mirrored to digits-large on
    deployment b (which then loads it); `second-opinion`: digits version 2, then, for the
    rows it is unsure of, digits version 1 (stage `recheck`), mirrored to version 2 on b."""
    served = yaml.safe_load(DEFAULT_CONFIG.read_text())["pipelines"]
    mirrored = copy.deepcopy(served["digits-cascade"])
    mirrored["stages"][0]["model"]["shadow"] = {"deployment": "b"}
    second = copy.deepcopy(served["digits-cascade"])
    second["model"] = {"name": "digits", "version": "2"}
    second["stages"] = [
        {
            **second["stages"][0],
            "name": "recheck",
            "model": {
                "name": "digits",
                "version": "1",
                "shadow": {"deployment": "b", "version": "2"},
            },
        }
    ]
    return {"mirrored": mirrored, "second-opinion": second}


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {
        "gateway": {"admin_token": TOKEN},
        "inference": {"admin_token": MODELS_TOKEN},
        "services": {"gateway": {"metrics": metrics_address()}},
        "pipelines": pipelines(),
    }
    with running_system(tmp_path_factory.mktemp("stage-shadow"), changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def admin(system: Supervisor) -> admin_pb2_grpc.AdminStub:
    return admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))


def infer(stub, pipeline: str, images: np.ndarray, client: str, timeout: float = 30):
    request = codec.build_request(pipeline, {"images": images})
    return stub.ModelInfer(request, timeout=timeout, metadata=(("x-client-id", client),))


def classes(reply: v2.ModelInferResponse) -> list[int]:
    return codec.response_outputs(reply)["labels"][:, 0].astype(int).tolist()


def unsure(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).max(axis=1) < UNSURE


def compared(system: Supervisor) -> Callable[..., float]:
    """How many comparisons of each kind were counted since now, by labels."""
    address = system.settings.services.gateway.metrics
    before = scrape(address).get(SHADOW[0], [])

    def grown(**labels: str) -> float:
        after = scrape(address).get(SHADOW[0], [])
        return total(after, SHADOW[1], **labels) - total(before, SHADOW[1], **labels)

    return grown


def settle(grown: Callable[..., float], expected: float, **labels: str) -> None:
    """Wait (the mirror is off the request's path) until `expected` comparisons are counted."""
    deadline = time.monotonic() + 15
    while grown(**labels) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert grown(**labels) == expected


def branching_requests(count: int) -> list[np.ndarray]:
    """`count` two-row requests for the default cascade, each one row digits version 1 is
    unsure of (it takes the large stage's branch) and one it is sure of."""
    data = np.load(BUILD / "data" / "digits_test.npz")["images"]
    branch = unsure(logits("digits", data, "1"))
    taken, kept = np.flatnonzero(branch), np.flatnonzero(~branch)
    return [data[[taken[i % len(taken)], kept[i]]] for i in range(count)]


def test_the_rows_that_take_the_branch_are_mirrored_and_compared(stub, system) -> None:
    data = np.load(BUILD / "data" / "digits_test.npz")["images"][:240]
    first, own = logits("digits", data, "2"), logits("digits", data, "1")
    branch = unsure(first)
    expected = np.where(branch, own.argmax(axis=1), first.argmax(axis=1))
    requests = np.split(np.arange(len(data)), 60)
    mirrored = [rows for rows in requests if branch[rows].any()]
    differ = sum(bool((own.argmax(1) != first.argmax(1))[r][branch[r]].any()) for r in mirrored)
    assert 0 < differ < len(mirrored) < len(requests), "some agree, some not, some exit early"
    grown = compared(system)
    for i, rows in enumerate(requests):
        reply = infer(stub, "second-opinion", data[rows], client=f"c{i}")
        assert classes(reply) == expected[rows].tolist()
        stages = reply.parameters["strata.stages"].string_param
        assert stages == ("digits,recheck" if branch[rows].any() else "digits")
    settle(grown, len(mirrored), pipeline="second-opinion/recheck")
    assert grown(pipeline="second-opinion/recheck", result="disagree") == differ
    assert grown(pipeline="second-opinion/recheck", result="agree") == len(mirrored) - differ
    assert grown(pipeline="second-opinion") == 0, "the first model has no shadow"


def test_the_admin_status_and_the_index_show_a_stage_shadow(stub, system, admin) -> None:
    before = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["mirrored"]
    grown = compared(system)
    sent = branching_requests(6)
    for i, images in enumerate(sent):
        assert classes(infer(stub, "mirrored", images, client=f"s{i}")) == (
            cascade(images)[0].tolist()
        )
    settle(grown, len(sent), pipeline="mirrored/large")
    assert grown(pipeline="mirrored/large", result="agree") == len(sent), "the same model"
    status = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["mirrored"]
    assert not status.HasField("shadow"), "the first model has none"
    (large,) = status.stages
    assert (large.stage, large.shadow.deployment, large.shadow.version) == ("large", "b", "")
    assert large.shadow.compared == before.stages[0].shadow.compared + len(sent)
    assert large.shadow.agreed == before.stages[0].shadow.agreed + len(sent)
    assert large.shadow.p50_ms > 0
    index = stub.RepositoryIndex(v2.RepositoryIndexRequest(), metadata=AUTH, timeout=10).models
    entries = {e.reason.split(":")[0]: e for e in index if e.name == "mirrored"}
    assert set(entries) == {"arm a", "stage large arm a", "stage large shadow"}
    shadow = entries["stage large shadow"]
    assert shadow.state == "READY", "deployment b loads the stage's model for its shadow"
    assert "model digits-large version latest on inference deployment b" in shadow.reason


def test_a_hung_shadow_deployment_costs_the_client_nothing(stub, system) -> None:
    """Deployment b (the shadow's, on no request's path) stops answering: every request is
    answered at once; its copies wait until their requests' deadlines and fail, and once
    the shadow's calls in flight reach their bound the copies beyond it are dropped."""
    sent = branching_requests(40)
    grown = compared(system)
    hung = system.processes["inference-b"]
    hung.send_signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(8) as pool:
            replies = list(
                pool.map(
                    lambda each: infer(stub, "mirrored", each[1], f"h{each[0]}", HUNG_TIMEOUT),
                    enumerate(sent),
                )
            )
        for reply, images in zip(replies, sent, strict=True):
            assert classes(reply) == cascade(images)[0].tolist()
            assert reply.parameters["strata.stages"].string_param == "digits,large"
        settle(grown, len(sent), pipeline="mirrored/large")
    finally:
        hung.send_signal(signal.SIGCONT)
    errors = grown(pipeline="mirrored/large", result="error")
    dropped = grown(pipeline="mirrored/large", result="dropped")
    assert errors + dropped == len(sent)
    assert 0 < errors <= 16 and dropped > 0, "at most max_inflight copies wait; the rest drop"
