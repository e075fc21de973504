"""The postprocess rule engine."""

from __future__ import annotations

from pydantic import Field

from strata.config.base import Strict


class PostprocessSettings(Strict):
    """The rule engine: time limits and the threads rule chains run on."""

    rule_timeout_seconds: float = Field(
        default=0.5, gt=0, description="Time limit of a rule that sets no timeout_seconds."
    )
    workers: int = Field(default=4, gt=0, description="Rule chains running at once (threads).")
    spare_threads: int = Field(
        default=4,
        ge=0,
        description="Extra threads that abandoned (overrunning) rules may hold until they end.",
    )
