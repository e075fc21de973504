"""Plugins for the tests: steps and rules of "user code", named by import path
(`tests.support.plugins:Name`) in test configs, and the built-in resize as a plugin, to
measure what the plugin path costs against the same code built in."""

from __future__ import annotations

from services.preprocess.steps import image
from strata import plugins
from strata.config.preprocess import ResizeStep
from strata.plugins import Arrays, RuleContext, RuleTimeout, take


class Fragile:
    """A step and a rule that passes its tensors on, but raises a plain RuntimeError (a
    plugin's bug) when a row of `input` starts with `poison`."""

    class Options(plugins.Options):
        input: str
        poison: int = 255

    def __init__(self, options: Fragile.Options) -> None:
        self.options = options

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.input,)

    def process(self, tensors: Arrays) -> Arrays:
        values = take(tensors, self.options.input, "fragile")
        if (values.reshape(len(values), -1)[:, 0] == self.options.poison).any():
            raise RuntimeError("a poisoned row")
        return tensors

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        return self.process(tensors)


class Bare:
    """A step without options: built as Bare()."""

    def process(self, tensors: Arrays) -> Arrays:
        return tensors


class NoProcess:
    """Not a step: it has no process method."""


class Late:
    """A rule that stops as one does at its time limit (RuleTimeout, a TimeoutError)."""

    inputs = ("logits",)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        raise RuleTimeout("stopped at its limit")


class Resize(image.Resize):
    """The built-in resize's own class and options as a plugin: only how it is found and
    built differs."""

    class Options(ResizeStep):
        kind: str = "resize"  # a plugin's options never hold its kind; the class reads it


class Copy:
    """A step that copies `input` to `output` and says so (`outputs`), so that what follows
    it is checked at start-up; `datatype` is what it claims the copy is."""

    class Options(plugins.Options):
        input: str
        output: str
        datatype: str | None = None

    def __init__(self, options: Copy.Options) -> None:
        self.options = options

    @property
    def outputs(self) -> dict[str, plugins.Made]:
        return {self.options.output: plugins.Made(self.options.datatype)}

    def process(self, tensors: Arrays) -> Arrays:
        return {**tensors, self.options.output: take(tensors, self.options.input, "copy")}


class Shrink:
    """A step and a rule that cuts the last column off `input` and does not say what it
    makes: only a request shows that the model or the declared outputs then get less. With
    `poison`, only a flight with a row that starts with it is cut (the rest pass as they
    came), so that a check at start on other values finds nothing wrong."""

    class Options(plugins.Options):
        input: str
        poison: float | None = None

    def __init__(self, options: Shrink.Options) -> None:
        self.inputs = (options.input,)
        self.poison = options.poison

    def process(self, tensors: Arrays) -> Arrays:
        (name,) = self.inputs
        values = take(tensors, name, "shrink")
        if (
            self.poison is not None
            and not (values.reshape(len(values), -1)[:, 0] == self.poison).any()
        ):
            return tensors
        return {**tensors, name: values[..., :-1]}

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        return self.process(tensors)
