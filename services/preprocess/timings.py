"""Per-step durations of preprocess pipelines (exported as a Prometheus histogram)."""

from strata.timings import Summary, Timings, stage_histogram

__all__ = ["STEP_SECONDS", "StepTimings", "Summary"]

STEP_SECONDS = stage_histogram("preprocess", "step")


class StepTimings(Timings):
    def __init__(self) -> None:
        super().__init__(STEP_SECONDS)
