"""Flights of photos through the real chain: they fit what the hops carry, and a step in load
fails nothing (issue 42).

The image pipeline of bench.image_chain (640x480 JPEGs in, about 150 KB each; a 150 KB UINT8
crop per photo out of preprocess, normalised inside the model; a model taking 16 a batch).
Its latency objective is long here, so that the ladder never sheds load on a busy test
machine: what is counted is the chain's own failures.
"""

from __future__ import annotations

import contextlib
import io
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from PIL import Image

from bench.deployment import running
from bench.image_chain import image_config
from bench.images import PIPELINE, photo_jpeg
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import closed
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import DEFAULT_CONFIG

SMALL_LIMIT = 512 * 1024  # three photos (a JPEG or its UINT8 crop: ~150 KB each), not four
OBJECTIVE_MS = 60_000


@contextlib.contextmanager
def image_system(folder: Path, max_message_bytes: int | None = None) -> Iterator[Supervisor]:
    config = image_config(DEFAULT_CONFIG, folder, OBJECTIVE_MS)
    if max_message_bytes is not None:
        raw = yaml.safe_load(config.read_text())
        raw["server"]["max_message_bytes"] = max_message_bytes
        config.write_text(yaml.safe_dump(raw))
    run = folder / "run"
    run.mkdir()
    with running(config, run, gateway_metrics=True) as (supervisor, _):
        yield supervisor


def flights_within(supervisor: Supervisor, requests: int) -> tuple[int, int, int]:
    """Flights so far (the gateway's histogram): in all, of one request, of at most
    `requests` (a bucket bound)."""
    address = supervisor.settings.services.gateway.metrics
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as page:
        text = page.read().decode()
    name = "strata_gateway_flight_requests_bucket"

    def bucket(bound: str) -> int:
        line = f'{name}{{le="{bound}"}} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        assert found, f"no {name} bucket {bound}"
        return int(float(found[0][len(line) :]))

    return bucket("+Inf"), bucket("1.0"), bucket(f"{requests:.1f}")


def photos(count: int, jpeg: bytes | None = None) -> bytes:
    images = np.array([jpeg or photo_jpeg()] * count, dtype=object)
    return codec.build_request(PIPELINE, {"image": images}).SerializeToString()


def flat_jpeg() -> bytes:
    """A photo of one colour: a few KB at the door, a whole 150 KB crop after preprocess."""
    buffer = io.BytesIO()
    Image.new("RGB", (640, 480), (90, 140, 200)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def failures(supervisor: Supervisor, steps: list[tuple[int, float]]) -> tuple[int, Counter]:
    """Answers and failures of one photo a request, stepping through (in flight, seconds)
    with no pause between steps."""
    plan = Plan(
        target=supervisor.address("gateway"),
        method=INFER,
        requests=(photos(1),),
        metadata=(("x-client-id", "test"),),
        timeout=60,
        connections=1,
    )
    answered, failed = 0, Counter[str]()
    with LoadPool(1) as pool:
        for concurrency, seconds in steps:
            results = closed(pool, plan, concurrency, seconds)
            answered += int(results.ok.sum())
            failed += results.error_counts()
    return answered, failed


@pytest.fixture(scope="module")
def small_limit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with image_system(tmp_path_factory.mktemp("small"), SMALL_LIMIT) as supervisor:
        yield supervisor


def infer(supervisor: Supervisor, request: bytes) -> grpc.RpcError | None:
    with grpc.insecure_channel(supervisor.address("gateway")) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        message = codec.v2.ModelInferRequest.FromString(request)
        try:
            stub.ModelInfer(message, timeout=60)
        except grpc.RpcError as exc:
            return exc
    return None


def test_a_request_too_large_for_one_message_is_refused_naming_the_limit(
    small_limit: Supervisor,
) -> None:
    assert infer(small_limit, photos(1, flat_jpeg())) is None
    for _ in range(2):  # at the hop that could not carry it, then before any hop
        error = infer(small_limit, photos(4, flat_jpeg()))
        assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert str(SMALL_LIMIT) in error.details() and "max_message_bytes" in error.details()


def test_flights_split_to_fit_a_small_message_limit(small_limit: Supervisor) -> None:
    before = flights_within(small_limit, 4)
    answered, failed = failures(small_limit, [(16, 3.0)])
    assert not failed, failed.most_common(3)
    assert answered > 16
    flights, alone, within = (
        a - b for a, b in zip(flights_within(small_limit, 4), before, strict=True)
    )
    assert within == flights, "three photos' pixels a message at most: flights of 3 or fewer"
    assert alone < flights, "yet flights of several"


def test_a_step_from_one_to_sixteen_to_sixty_four_photos_in_flight_fails_nothing(
    tmp_path: Path,
) -> None:
    with image_system(tmp_path) as supervisor:
        answered, failed = failures(supervisor, [(1, 2.0), (16, 3.0), (64, 4.0)])
        flights, alone, within = flights_within(supervisor, 16)
    assert not failed, failed.most_common(3)
    assert answered > 64
    assert within == flights, "no flight carries more than the model's batch of 16"
    assert alone < flights
