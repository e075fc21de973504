"""A phone photo through an image pipeline on the default limits, and the docs' curl of a
JPEG over REST (issue 51): the config of the image tests (bench.image_chain's `images`
pipeline added to configs/default.yaml, a JPEG through decode, resize, crop, normalize and
layout), nothing raised. The curl is docs/gateway.md's own block, run as a user would."""

from __future__ import annotations

import io
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
from PIL import Image

from bench.images import PIPELINE
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.e2e.test_image_flights import image_system
from tests.support.system import ROOT

GUIDE = ROOT / "docs" / "gateway.md"
SECTION = "### Images over REST"
REST = "127.0.0.1:8000"
PHONE = (4000, 3000)  # 12 MP


def phone_jpeg() -> bytes:
    """A 12 MP JPEG of noise at quality 95: about 8 MB, the size of a phone's photo."""
    image = Image.merge("RGB", [Image.effect_noise(PHONE, sigma) for sigma in (16, 20, 24)])
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def photo() -> bytes:
    data = phone_jpeg()
    assert len(data) > 6 * 1024 * 1024, len(data)  # far past the 1 MiB elements were held to
    return data


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with image_system(tmp_path_factory.mktemp("photos")) as supervisor:
        yield supervisor


def test_a_phone_photo_is_answered_on_the_default_limits(system: Supervisor, photo: bytes) -> None:
    request = codec.build_request(PIPELINE, {"image": np.array([photo], dtype=object)})
    with grpc.insecure_channel(system.address("gateway")) as channel:
        reply = v2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert codec.response_outputs(reply)["scores"].shape == (1, 5)


def curl_block() -> str:
    text = GUIDE.read_text().split(f"\n{SECTION}\n", 1)[1]
    return re.search(r"^```sh\n(.*?)^```", text, re.S | re.M).group(1)


def test_the_docs_curl_of_a_jpeg_answers(system: Supervisor, photo: bytes, tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(photo)
    block = curl_block().replace(REST, system.settings.services.gateway.rest)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = orjson.loads(done.stdout)
    assert answer["model_name"] == PIPELINE, answer
    assert {o["name"]: o["shape"] for o in answer["outputs"]} == {
        "scores": [1, 5],
        "classes": [1, 5],
    }


def test_a_jpeg_sent_unframed_is_refused_with_the_framing_said(
    system: Supervisor, photo: bytes
) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(photo)},
                }
            ]
        }
    )
    request = urllib.request.Request(
        f"http://{system.settings.services.gateway.rest}/v2/models/{PIPELINE}/infer",
        header + photo,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    error = orjson.loads(refused.value.read())["error"]
    assert "BYTES element 0 runs past the data; each BYTES element is framed" in error
    assert "its length as 4 bytes, little endian, then its bytes" in error
