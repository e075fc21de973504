"""The config's `limits`: what one tensor may declare, on every port of every layer."""

from __future__ import annotations

from pydantic import Field

from strata.config.base import Strict
from strata.wire.limits import Limits


class TensorLimits(Strict):
    """What one tensor may declare, on every port of every layer."""

    max_rank: int = Field(
        default=Limits.max_rank, ge=1, le=32, description="Most dimensions a tensor has."
    )
    max_dimension: int = Field(
        default=Limits.max_dimension, gt=0, description="Largest size of any one dimension."
    )
    max_elements: int = Field(
        default=Limits.max_elements,
        gt=0,
        description="Most elements a tensor holds (its 0 dimensions counted as 1, so that an "
        "empty tensor cannot declare a shape no array could take).",
    )
    max_bytes: int = Field(
        default=Limits.max_bytes, gt=0, description="Largest tensor, in bytes on the wire."
    )
    max_strings: int = Field(
        default=Limits.max_strings,
        gt=0,
        description="Most elements a BYTES tensor holds: each becomes a Python object when "
        "decoded, so this bounds the work a string tensor costs.",
    )

    def plain(self) -> Limits:
        """These limits as strata.wire.limits checks them."""
        return Limits(**self.model_dump())
