"""Crop the centre of each image, e.g. before resizing it to the model's input size."""

from __future__ import annotations

from pydantic import Field

from strata import plugins
from strata.plugins import Arrays, Made, StepError, take


class CenterCrop:
    """Keep the centre `fraction` of each image's height and width ([batch, H, W] or
    [batch, H, W, C], any datatype); at least one pixel is kept on each axis."""

    class Options(plugins.Options):
        input: str = Field(description="The images, cropped in place.")
        fraction: float = Field(gt=0, le=1, description="Share of height and width kept.")

    def __init__(self, options: CenterCrop.Options) -> None:
        self.input = options.input
        self.fraction = options.fraction

    @property
    def outputs(self) -> dict[str, Made]:
        """It crops its input in place, keeping its datatype and rank."""
        return {self.input: Made()}

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, "center_crop")
        if images.ndim not in (3, 4):
            raise StepError(
                f"input {self.input!r}: center_crop needs [batch, H, W] or [batch, H, W, C] "
                f"images, got shape {list(images.shape)}"
            )
        rows = _centre(images.shape[1], self.fraction)
        columns = _centre(images.shape[2], self.fraction)
        return {**tensors, self.input: images[:, rows, columns]}


def _centre(size: int, fraction: float) -> slice:
    """The middle round(size * fraction) of `size` pixels (at least one)."""
    kept = max(1, round(size * fraction))
    start = (size - kept) // 2
    return slice(start, start + kept)
