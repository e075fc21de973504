"""The gateway's v2 statistics (services/gateway/flow/statistics.py): a pipeline's numbers
in v2 terms, and per model version adding up to the pipeline's."""

import numpy as np

from services.gateway.flow.statistics import Hops, Statistics
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec


def answer(rows: int, **parameters: bool | str) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(model_name="p")
    codec.add_outputs(response, {"y": np.zeros((rows, 2), np.float32)})
    for key, value in parameters.items():
        field = "bool_param" if isinstance(value, bool) else "string_param"
        setattr(response.parameters[key], field, value)
    return response


def test_statistics_add_up_in_v2_terms() -> None:
    stats = Statistics()
    stats.flew("p", 2, Hops(preprocess=0.001, inference=0.002, postprocess=0.003))
    stats.finished("p", 0.010, answer(3))
    stats.finished("p", 0.012, answer(1))
    stats.finished("p", 0.001, answer(1, **{"strata.cached": True}))
    stats.finished("p", 0.002, answer(1, **{"strata.degraded_source": "default"}))
    stats.finished("p", 0.004, None)
    message = stats.model_statistics("p", "1")
    infer = message.inference_stats
    fields = ("success", "fail", "cache_hit", "queue", "compute_input", "compute_infer")
    ms = {
        name: (getattr(infer, name).count, round(getattr(infer, name).ns / 1e6, 3))
        for name in (*fields, "compute_output")
    }
    assert (message.name, message.version) == ("p", "1")
    assert (message.inference_count, message.execution_count) == (6, 1)
    assert ms == {
        "success": (4, 25),
        "fail": (1, 4),
        "cache_hit": (1, 1),
        "queue": (2, 10),  # the chain's two answers took 22 ms, 12 ms of it in the hops
        "compute_input": (2, 2),
        "compute_infer": (2, 4),
        "compute_output": (2, 6),
    }
    assert message.last_inference > 0
    assert stats.model_statistics("never", "1").inference_stats.success.count == 0


def test_statistics_per_model_version_add_up_to_the_pipeline() -> None:
    stats = Statistics()
    hops = Hops(preprocess=0.001, inference=0.002, postprocess=0.003)
    stats.flew("p", 2, hops, "1")
    stats.flew("p", 1, hops, "2")
    for version, rows in (("1", 3), ("1", 1), ("2", 5)):
        response = answer(rows)
        response.model_version = version
        stats.finished("p", 0.010, response)
    stats.finished("p", 0.004, None)  # failed: no version answered
    whole = stats.model_statistics("p", "1")
    one, two = (stats.model_statistics("p", v, model_version=v) for v in ("1", "2"))
    assert stats.versions("p") == ["1", "2"]
    assert (one.version, one.inference_count, one.execution_count) == ("1", 4, 1)
    assert (two.version, two.inference_count, two.execution_count) == ("2", 5, 1)
    assert (whole.inference_count, whole.execution_count) == (9, 2)
    counts = [m.inference_stats.success.count for m in (one, two, whole)]
    assert counts == [2, 1, 3]
    assert [m.inference_stats.fail.count for m in (one, two, whole)] == [0, 0, 1]
    assert one.inference_stats.compute_infer.count == 2
    assert stats.model_statistics("p", "3", model_version="3").inference_count == 0
