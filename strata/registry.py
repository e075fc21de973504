"""What preprocess steps and postprocess rules share: a registry of built-in classes by kind,
and the user's own steps and rules (plugins) found, checked and guarded.

A stage maps a request's tensors (name -> array, batch first) to new tensors; the interface
is public, in strata.plugins. The config declares each built-in kind's options as a model
(strata.config.preprocess and .postprocess), and its class is registered under that kind
(`@STEPS.register("resize")`). A built-in is then built as a plugin is: `Name(options)`, the
model already validated, kept by the class and read from there, never copied field by field.
The few that read a file (statistics, a tokenizer, a vocabulary, a labels or keywords file)
are registered with `repository=True` and built as `Name(options, repository)`: the folder
that file options are relative to is their second argument, and only theirs. A kind that is
not a built-in names a plugin: `Family.load` imports it and validates its options (in the
service that runs it, never in the gateway), and `Registry.build` builds it behind a guard
that turns its unexpected exceptions into UNAVAILABLE naming the stage.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, TypeAdapter, ValidationError

from strata.errors import StrataError, Unavailable, cut

if TYPE_CHECKING:  # names only: the config (and the launcher) reads this without numpy
    from strata.plugins import Rule, RuleContext, Step
    from strata.wire.codec import Arrays

__all__ = [
    "Family",
    "Plugin",
    "PluginError",
    "Registry",
    "dotted",
    "guard_rule",
    "guard_step",
]

log = logging.getLogger(__name__)

Location = tuple[str | int, ...]


class Spec(Protocol):
    """A stage's config: its kind picks the class; its label names it."""

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str: ...


@runtime_checkable
class PluginSpec(Protocol):
    """A stage's config whose kind names a plugin (strata.config's PluginStep, PluginRule)."""

    kind: str

    def plugin(self, repository: Path) -> Plugin: ...


S = TypeVar("S", bound=Spec)
T = TypeVar("T")
C = TypeVar("C", bound=type)


class PluginError(ValueError):
    """A plugin stage that cannot be built: each problem with where it is in the stage
    (("kind",) for the class, (kind, key, ...) for an option), as config errors say it."""

    def __init__(self, problems: Sequence[tuple[Location, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{dotted(loc)}: {msg}" for loc, msg in self.problems))


def dotted(loc: Location) -> str:
    """A location in a config, as its error messages write it: pipelines.digits.preprocess.0."""
    return ".".join(str(part) for part in loc)


@dataclass(frozen=True)
class Plugin:
    """A plugin's class and its validated options (None: the class takes none)."""

    kind: str
    cls: type
    options: BaseModel | None

    def instance(self) -> object:
        """The class built as the contract says: `Name(options)`, or `Name()`."""
        return self.cls() if self.options is None else self.cls(self.options)


@dataclass(frozen=True)
class Family:
    """One kind of stage ("preprocess step"): its entry-point group and what its class needs."""

    what: str
    group: str
    method: str  # the method a class of this family must have
    builtins: frozenset[str]

    def load(self, kind: str, options: Mapping[str, Any], repository: Path) -> Plugin:
        """The class `kind` names, with `options` validated by its `Options` (validators
        see the repository folder as `info.context["repository"]`); PluginError says why not."""
        cls = self._find(kind)
        return Plugin(kind, cls, _options(kind, cls, options, {"repository": repository}))

    def _find(self, kind: str) -> type:
        target = _imported(kind) if ":" in kind else self._entry_point(kind)
        if not inspect.isclass(target):
            self._refuse(f"{kind!r} is {type(target).__name__}, not a class")
        if not callable(getattr(target, self.method, None)):
            self._refuse(f"{kind!r} is not a {self.what}: it has no method {self.method!r}")
        return target

    def _entry_point(self, name: str) -> Any:
        found = metadata.entry_points(group=self.group, name=name)
        if not found:
            installed = sorted(metadata.entry_points(group=self.group).names)
            self._refuse(
                f"{name!r} is neither a built-in {self.what} ({', '.join(sorted(self.builtins))}) "
                f"nor an entry point in group {self.group!r} (installed: "
                f"{', '.join(installed) or 'none'}); an import path is written package.module:Name"
            )
        if len(found) > 1:
            values = sorted(point.value for point in found)
            self._refuse(f"entry point {name!r} of {self.group!r} is declared twice: {values}")
        (point,) = found
        return _guarded_import(point.value, point.load)

    @staticmethod
    def _refuse(message: str) -> NoReturn:
        raise PluginError([(("kind",), message)])


def _imported(path: str) -> Any:
    module_name, _, attributes = path.partition(":")

    def load() -> Any:
        target: Any = importlib.import_module(module_name)
        for attribute in attributes.split("."):
            target = getattr(target, attribute)
        return target

    return _guarded_import(path, load)


def _guarded_import(path: str, load: Callable[[], Any]) -> Any:
    """Whatever importing a plugin raises (a missing module, a bug at import) as a PluginError."""
    try:
        return load()
    except ModuleNotFoundError as exc:
        message = f"cannot import {path!r}: no module named {exc.name!r}"
    except AttributeError:
        module, _, name = path.partition(":")
        message = f"cannot import {path!r}: module {module!r} has no {name!r}"
    except Exception as exc:  # the plugin's own code ran and failed
        message = f"importing {path!r} failed: {type(exc).__name__}: {exc}"
    raise PluginError([(("kind",), message)])


def _options(
    kind: str, cls: type, options: Mapping[str, Any], context: dict[str, Any]
) -> BaseModel | None:
    """The stage's own keys validated by the class's `Options`; a class without one takes
    none. Unknown keys are refused unless the model itself says extra="allow"."""
    model = getattr(cls, "Options", None)
    if model is None:
        if options:
            problems = [((kind, key), f"{kind!r} takes no options (no Options)") for key in options]
            raise PluginError(problems)
        return None
    if not (inspect.isclass(model) and issubclass(model, BaseModel)):
        raise PluginError([(("kind",), f"{kind!r}: Options must be a pydantic model")])
    unknown = _unknown_keys(model, options)
    try:
        validated = model.model_validate(dict(options), context=context)
    except ValidationError as exc:
        errors = [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]
        raise PluginError([((kind, *loc), msg) for loc, msg in unknown + errors]) from None
    if unknown:
        raise PluginError([((kind, *loc), msg) for loc, msg in unknown])
    return validated


def _unknown_keys(model: type[BaseModel], options: Mapping[str, Any]) -> list[tuple[Location, str]]:
    """Keys the model would silently ignore (pydantic's default), refused as the built-ins'
    are; a model that forbids or allows extra keys decides for itself."""
    if model.model_config.get("extra") not in (None, "ignore"):
        return []
    known = {alias for name, info in model.model_fields.items() for alias in (name, info.alias)}
    return [((key,), "Extra inputs are not permitted") for key in options if key not in known]


class Registry(Generic[S, T]):
    """The built-in classes by kind, for one family of stage ("preprocess step",
    "postprocess rule").

    `classes` maps every kind this family implements to its class, built from its kind's
    spec as `Name(spec)`, or `Name(spec, repository)` where it was registered with
    `repository=True`. `specs` is the family's config type (a union of models chosen by kind),
    for building from a plain mapping. A spec whose kind is not a built-in names a plugin,
    built and wrapped by `guard` (which names it by its label).
    """

    def __init__(
        self, what: str, specs: Any, protocol: type, guard: Callable[[Any, str], T]
    ) -> None:
        self.what = what
        self._spec_type = specs
        self._protocol = protocol
        self._guard = guard
        self.classes: dict[str, Callable[..., T]] = {}
        self._reading: set[str] = set()  # kinds built with the repository folder

    def register(self, kind: str, *, repository: bool = False) -> Callable[[C], C]:
        """Register the decorated class as the built-in `kind`; `repository`: it reads files,
        and takes the folder they are relative to after its options."""

        def wrap(cls: C) -> C:
            self.classes[kind] = cls
            if repository:
                self._reading.add(kind)
            return cls

        return wrap

    def build(self, spec: S, base_dir: Path) -> T:
        """Build the stage `spec` describes; what a file makes wrong raises ValueError."""
        cls = self.classes.get(spec.kind)
        if cls is not None:
            return cls(spec, base_dir) if spec.kind in self._reading else cls(spec)
        given: Spec = spec  # mypy cannot narrow the class's type variable by a protocol
        if not isinstance(given, PluginSpec):
            known = ", ".join(sorted(self.classes))
            raise ValueError(f"unknown {self.what} {spec.kind!r} (known: {known})")
        stage = given.plugin(base_dir).instance()
        if not isinstance(stage, self._protocol):
            raise ValueError(f"{spec.kind!r} does not implement {self._protocol.__name__}")
        return self._guard(stage, spec.label)

    def build_options(self, kind: str, options: Mapping[str, Any], base_dir: Path) -> T:
        """Build from a plain mapping, validated as the config file's stages are (for tools
        and tests; pydantic's ValidationError names a wrong option)."""
        return self.build(self._specs.validate_python({"kind": kind, **options}), base_dir)

    @functools.cached_property
    def _specs(self) -> TypeAdapter[S]:
        """Built on first use: serving validates stages with the config, never here."""
        return TypeAdapter(self._spec_type)


def _failed(what: str, label: str, exc: Exception) -> Unavailable:
    """A plugin's unexpected exception: logged whole, answered UNAVAILABLE naming the stage."""
    log.error("%s %r raised %s", what, label, type(exc).__name__, exc_info=exc)
    return Unavailable(f"{what} {label!r} failed: {type(exc).__name__}: {cut(str(exc))}")


@dataclass(frozen=True)
class _GuardedStep:
    step: Step
    label: str

    @property
    def outputs(self) -> object:
        """What the plugin says it makes (strata.plugins.Made), if it says."""
        return getattr(self.step, "outputs", None)

    def process(self, tensors: Arrays) -> Arrays:
        try:
            return self.step.process(tensors)
        except StrataError:
            raise
        except Exception as exc:
            raise _failed("preprocess step", self.label, exc) from exc


@dataclass(frozen=True)
class _GuardedRule:
    rule: Rule
    label: str

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.rule.inputs)

    @property
    def outputs(self) -> object:
        """What the plugin says it makes (strata.plugins.Made), if it says."""
        return getattr(self.rule, "outputs", None)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        try:
            return self.rule.apply(tensors, context)
        except (StrataError, TimeoutError):  # a timeout is the engine's: the rule is skipped
            raise
        except Exception as exc:
            raise _failed("postprocess rule", self.label, exc) from exc


def guard_step(step: Step, label: str) -> Step:
    """A plugin step whose unexpected exceptions are UNAVAILABLE naming it."""
    return _GuardedStep(step, label)


def guard_rule(rule: Rule, label: str) -> Rule:
    """A plugin rule whose unexpected exceptions are UNAVAILABLE naming it."""
    return _GuardedRule(rule, label)
