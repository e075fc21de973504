"""ModelStatistics at the gateway: each pipeline's requests and their times, in v2 terms.

What Triton's clients and perf_analyzer read, counted where requests finish (the servicer)
and where flights are answered (the chain):

- success / fail: requests answered OK / with an error, and their whole time at the gateway;
- cache_hit: the OK answers that came from the result cache;
- compute_input / compute_infer / compute_output: for each request the chain answered, its
  flight's preprocess, inference and postprocess calls (each request of a flight counts the
  flight's whole call, as Triton counts a batch's run for each request in it);
- queue: the rest of those requests' time at the gateway (waiting for a flight, admission,
  validation, encoding), so that queue and the three computes add up to their whole time;
- inference_count: rows answered OK; execution_count: inference calls that answered a flight;
- last_inference: when the last request finished, in ms since the epoch.

The ladder's default answers count in success only.

Each pipeline's numbers are kept whole and again per model version that answered (the
version its arm serves, as strata.model_version says), so that a client asking for a
version gets one entry of that version's numbers, as Triton answers per version. A failed
request has no version that answered: it counts in the pipeline's fail only.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.v2stats import Duration, model_statistics


@dataclass(frozen=True)
class Hops:
    """One flight's calls, in seconds."""

    preprocess: float
    inference: float
    postprocess: float


@dataclass
class PipelineStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    chained: Duration = field(default_factory=Duration)  # OK answers the chain gave
    preprocess: Duration = field(default_factory=Duration)
    inference: Duration = field(default_factory=Duration)
    postprocess: Duration = field(default_factory=Duration)
    rows: int = 0
    executions: int = 0
    last_ms: int = 0


class Statistics:
    """Every pipeline's numbers since the gateway started, whole and per model version."""

    def __init__(self) -> None:
        self._pipelines: defaultdict[str, PipelineStats] = defaultdict(PipelineStats)
        self._versions: defaultdict[tuple[str, str], PipelineStats] = defaultdict(PipelineStats)

    def _kept(self, pipeline: str, version: str) -> list[PipelineStats]:
        """The pipeline's whole numbers, and its version's where one answered."""
        whole = self._pipelines[pipeline]
        return [whole, self._versions[pipeline, version]] if version else [whole]

    def versions(self, pipeline: str) -> list[str]:
        """The model versions that have answered requests of `pipeline`."""
        return sorted(version for name, version in self._versions if name == pipeline)

    def finished(
        self, pipeline: str, seconds: float, response: v2.ModelInferResponse | None
    ) -> None:
        """A request of `pipeline` ended after `seconds`: with `response`, or None if it
        failed."""
        now_ms = int(time.time() * 1000)
        if response is None:
            stats = self._pipelines[pipeline]
            stats.last_ms = now_ms
            stats.fail.add(seconds)
            return
        outputs = response.outputs
        rows = outputs[0].shape[0] if outputs and outputs[0].shape else 1
        parameters = response.parameters
        cached = "strata.cached" in parameters and parameters["strata.cached"].bool_param
        chained = not cached and "strata.degraded_source" not in parameters  # not a default
        for stats in self._kept(pipeline, response.model_version):
            stats.last_ms = now_ms
            stats.success.add(seconds)
            stats.rows += rows
            if cached:
                stats.cache_hit.add(seconds)
            elif chained:
                stats.chained.add(seconds)

    def flew(self, pipeline: str, answered: int, hops: Hops, version: str = "") -> None:
        """A flight's inference call, by model `version`, and its hops answered `answered`
        requests."""
        for stats in self._kept(pipeline, version):
            stats.executions += 1
            stats.preprocess.add(hops.preprocess * answered, answered)
            stats.inference.add(hops.inference * answered, answered)
            stats.postprocess.add(hops.postprocess * answered, answered)

    def model_statistics(
        self, pipeline: str, version: str, model_version: str = ""
    ) -> v2.ModelStatistics:
        """`pipeline`'s numbers as v2 reports them under `version`: its whole, or with
        `model_version`, only what that model version answered."""
        if model_version:
            stats = self._versions.get((pipeline, model_version), PipelineStats())
        else:
            stats = self._pipelines[pipeline]
        computed = stats.preprocess.seconds + stats.inference.seconds + stats.postprocess.seconds
        queue = Duration(stats.chained.count, max(0.0, stats.chained.seconds - computed))
        return model_statistics(
            pipeline,
            version,
            stats.last_ms,
            stats.rows,
            stats.executions,
            success=stats.success,
            fail=stats.fail,
            queue=queue,
            compute_input=stats.preprocess,
            compute_infer=stats.inference,
            compute_output=stats.postprocess,
            cache_hit=stats.cache_hit,
        )


STATISTICS = Statistics()
