"""The preprocess service's Prometheus metrics: each step's duration, by pipeline.

`strata_preprocess_step_duration_seconds`, fed by `StepTimings`, which also keeps a small
in-memory summary per (pipeline, step) (see strata.telemetry.timings).
"""

from strata.telemetry.timings import Summary, Timings, stage_histogram

__all__ = ["STEP_SECONDS", "StepTimings", "Summary"]

STEP_SECONDS = stage_histogram("preprocess", "step")


class StepTimings(Timings):
    def __init__(self) -> None:
        super().__init__(STEP_SECONDS)
