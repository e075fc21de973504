"""Every process serves Prometheus metrics that tell the same story as the requests sent."""

import itertools
import re
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import ROOT, free_port, running_system


def metrics_address(count: int = 1) -> str:
    return f"127.0.0.1:{free_port(count)}"


def scrape(address: str) -> dict[str, list]:
    """Samples by metric family name."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as page:
        text = page.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list]]:
    changes = {
        "services": {
            "gateway": {"metrics": metrics_address()},
            "preprocess": {"metrics": metrics_address(2)},
            "postprocess": {"metrics": metrics_address()},
            "inference": {"a": {"metrics": metrics_address()}, "b": {"metrics": metrics_address()}},
        }
    }
    folder: Path = tmp_path_factory.mktemp("metrics")
    with running_system(folder, changes) as system:
        stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        for i in range(20):
            stub.ModelInfer(
                codec.build_request("digits", {"images": np.full((2, 8, 8), i, np.uint8)}),
                metadata=(("x-client-id", f"c{i}"),),
            )
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(codec.build_request("digits", {"images": np.zeros((1, 8), "u1")}))
        services = system.settings.services
        addresses = {
            "gateway": services.gateway.metrics,
            "postprocess": services.postprocess.metrics,
            "inference-a": services.inference["a"].metrics,
            "inference-b": services.inference["b"].metrics,
            **{
                f"preprocess-{i}": services.preprocess.metrics_for(listen)
                for i, listen in enumerate(services.preprocess.listens)
            },
        }
        refused_counted(addresses["gateway"])
        return {name: scrape(address) for name, address in addresses.items()}


def refused_counted(address: str, within: float = 5.0) -> None:
    """Wait until the gateway has counted the refused request: grpc.aio's abort sends the
    status to the client before the handler unwinds to where the count is kept."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        samples = scrape(address)["strata_rpc_server_requests"]
        if total(samples, "strata_rpc_server_requests_total", code="INVALID_ARGUMENT"):
            return
        time.sleep(0.05)


def total(samples: list, name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_every_process_counts_its_rpcs_and_reports_rss_and_cpu(scraped) -> None:
    for name, families in scraped.items():
        assert total(families["process_resident_memory_bytes"], "process_resident_memory_bytes")
        assert "process_cpu_seconds" in families, name
        assert families["strata_rpc_server_requests"], name
    gateway = scraped["gateway"]["strata_rpc_server_requests"]
    method = "/inference.GRPCInferenceService/ModelInfer"
    assert total(gateway, "strata_rpc_server_requests_total", method=method, code="OK") == 20
    bad = total(gateway, "strata_rpc_server_requests_total", method=method, code="INVALID_ARGUMENT")
    assert bad == 1


def test_replicas_share_the_preprocess_work(scraped) -> None:
    """Each flight's call is a message on one of the gateway's lanes (ProcessStream) or a
    unary Process call; both count as calls, and both replicas get some."""
    calls = [
        sum(
            total(
                scraped[f"preprocess-{i}"]["strata_rpc_server_requests"],
                "strata_rpc_server_requests_total",
                method=f"/strata.v1.Preprocess/{method}",
            )
            for method in ("Process", "ProcessStream")
        )
        for i in range(2)
    ]
    assert sum(calls) == 20 and min(calls) > 0


def test_gateway_histograms_and_arm_figures_parse(scraped) -> None:
    gateway = scraped["gateway"]
    buckets = [
        s
        for s in gateway["strata_gateway_request_duration_seconds"]
        if s.name.endswith("_bucket") and s.labels["pipeline"] == "digits"
    ]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 21
    assert all(a.value <= b.value for a, b in itertools.pairwise(buckets))
    arms = gateway["strata_gateway_arm_requests"]
    assert total(arms, "strata_gateway_arm_requests_total", pipeline="digits") == 20
    assert (
        total(gateway["strata_gateway_degradation_level"], "strata_gateway_degradation_level") == 0
    )


def test_inference_exports_batch_sizes_queue_and_execution_time(scraped) -> None:
    def digits(family: str, suffix: str, **labels: str) -> float:
        """A sample of `family` for model digits, over both deployments and every version."""
        deployments = (scraped["inference-a"], scraped["inference-b"])
        return sum(total(d[family], family + suffix, model="digits", **labels) for d in deployments)

    # The fixture sent 20 requests of 2 rows, one after another (the bad one never left the
    # gateway): each waited in a queue once, and each batch ran once.
    assert digits("strata_inference_batch_rows", "_sum") == 40
    batches = digits("strata_inference_batch_rows", "_count")
    assert 1 <= batches <= 20
    assert digits("strata_inference_queue_seconds", "_count") == 20
    assert digits("strata_inference_execution_seconds", "_count") == batches
    assert digits("strata_inference_requests", "_total", outcome="ok") == 20
    assert digits("strata_inference_requests", "_total", outcome="error") == 0
    families = scraped["inference-a"]
    assert "strata_inference_rejections" in families and "strata_inference_queue_rows" in families


def test_preprocess_and_postprocess_time_each_step_and_rule(scraped) -> None:
    steps = scraped["preprocess-0"]["strata_preprocess_step_duration_seconds"]
    assert {s.labels["step"] for s in steps if s.name.endswith("_count")} >= {"validate", "resize"}
    rules = scraped["postprocess"]["strata_postprocess_rule_duration_seconds"]
    assert {s.labels["rule"] for s in rules if s.name.endswith("_count")} >= {"softmax", "topk"}


# Exported only where an operator's switch is set (STRATA_TRACE_MEMORY): read by
# tests/e2e/test_gateway_memory.py, which sets it.
SWITCHED_ON = {"strata_python_traced_bytes"}


@pytest.mark.parametrize("page", ["docs/troubleshooting.md", "README.md", "docs/gateway.md"])
def test_every_metric_the_docs_name_is_exported(scraped, page: str) -> None:
    text = (ROOT / page).read_text()
    named = {n for n in re.findall(r"`((?:strata|process)_[a-z_]+)", text) if not n.endswith("_")}
    exported = {name for families in scraped.values() for name in families}
    families = {n.removesuffix("_total") for n in named} - SWITCHED_ON
    assert named and families <= exported, sorted(families - exported)
