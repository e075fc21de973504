"""The preprocess service."""

from __future__ import annotations

from pydantic import Field

from strata.config.base import Strict


class PreprocessSettings(Strict):
    """Where the preprocess steps run."""

    inline_max_bytes: int = Field(
        default=16384,
        ge=0,
        description="A call whose tensors hold at most this many bytes runs its steps on the "
        "event loop (a thread hand-off costs more than the steps of a small input); larger "
        "calls, e.g. big images or long texts, run on a worker thread so the loop stays free.",
    )
