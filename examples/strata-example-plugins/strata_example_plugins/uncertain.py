"""Answer `uncertain` where the model's best score is below a threshold."""

from __future__ import annotations

from pydantic import Field

from strata import plugins
from strata.plugins import Arrays, Made, RuleContext, numbers, take


class UncertainBelow:
    """Where a row's top score is below `threshold`, every label of that row becomes
    `label`; the scores are left as they are, so the client still sees how sure it was."""

    class Options(plugins.Options):
        scores: str = Field(description="The scores, [batch, ...]; a row's maximum counts.")
        labels: str = Field(description="The BYTES labels, [batch, ...], replaced in place.")
        threshold: float = Field(ge=0, le=1, description="Top scores below it are uncertain.")
        label: str = Field(default="uncertain", min_length=1, description="What they become.")

    def __init__(self, options: UncertainBelow.Options) -> None:
        self.options = options
        self.label = options.label.encode()

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.scores, self.options.labels)

    @property
    def outputs(self) -> dict[str, Made]:
        """It writes the labels, still BYTES, so what follows is checked at start-up."""
        return {self.options.labels: Made("BYTES")}

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        scores = numbers(tensors, self.options.scores, "uncertain_below")
        labels = take(tensors, self.options.labels, "uncertain_below")
        top = scores.reshape(len(scores), -1).max(axis=1)
        unsure = top < self.options.threshold
        if not unsure.any():
            return tensors
        relabelled = labels.copy()  # never modify the arrays a rule is given
        relabelled[unsure] = self.label
        return {**tensors, self.options.labels: relabelled}
