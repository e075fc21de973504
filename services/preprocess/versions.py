"""Pipelines fed per model version: steps whose files are the model version's own.

A step's file option may name `{version}` (`stats: tabular/{version}/stats.json`); the gateway
tells preprocess which version the request's arm calls, and the request runs the pipeline
built with that version's files. Each version's pipeline is built once: at start for every
version the routes call, later for a version first asked for (a gateway restarted with an arm
on version 3 while this preprocess kept running). Every build is checked against that
version's fingerprint and its model's inputs, as a pipeline is at start.

A hot swap replaces a version's files in place. At most every `version_check_seconds` a
version's files are looked at again (their sizes and times, not their contents); when they
changed, the version is rebuilt and checked again. A rebuild that fails the check keeps the
pipeline built from the files before, as the inference service keeps the version it
replaced when the new one fails; a version whose first build fails is refused with
FAILED_PRECONDITION saying why, and tried again once its files change.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from services.preprocess.metrics import StepTimings
from services.preprocess.pipeline import PreprocessPipeline, build_pipeline
from services.preprocess.steps.numeric import recorded_fingerprint
from strata.config.pipelines import Pipeline
from strata.config.preprocess import FILE_OPTIONS, VERSION, StandardizeStep, StepSpec
from strata.errors import InvalidArgument, NotReady, shown

log = logging.getLogger(__name__)

MODEL_VERSION = "model_version"  # the Process request's parameter that names the version
MAX_VERSION_DIGITS = 18
Stamp = tuple[tuple[int, int] | None, ...]  # each file's (size, mtime), None if missing


@dataclasses.dataclass(frozen=True)
class Build:
    """One version's pipeline (or why there is none) and the stamp of the files it read."""

    pipeline: PreprocessPipeline | None
    reason: str
    stamp: Stamp
    next_check: float


class VersionedPipeline:
    """One pipeline's builds, one per model version."""

    def __init__(
        self,
        name: str,
        spec: Pipeline,
        repository: Path,
        timings: StepTimings,
        check_seconds: float,
    ) -> None:
        self.name = name
        self._spec = spec
        self._root = repository
        self._timings = timings
        self._check_seconds = check_seconds
        self._builds: dict[str, Build] = {}
        self._lock = threading.Lock()  # one build at a time; the worker threads share them

    def build_all(self, versions: Iterable[str]) -> None:
        """Build `versions` now; ValueError naming the first that fails (start-up stops)."""
        for version in versions:
            build = self._refresh(version)
            if build.pipeline is None:
                raise ValueError(build.reason)

    def for_version(self, version: str) -> PreprocessPipeline:
        """The pipeline built with `version`'s files; NotReady if they fail the checks."""
        build = self._builds.get(version)
        if build is None:
            build = self._refresh(self._known(_checked(self.name, version)))
        elif time.monotonic() >= build.next_check:
            build = self._refresh(version)
        if build.pipeline is None:
            raise NotReady(build.reason)
        return build.pipeline

    def _known(self, version: str) -> str:
        """`version` if the repository has its folder; NotReady otherwise, remembering
        nothing (a caller naming any number must not grow the builds)."""
        model = self._spec.model.name
        if not (self._root / model / version).is_dir():
            raise NotReady(f"model {model!r} has no version {version} in the repository")
        return version

    def _refresh(self, version: str) -> Build:
        with self._lock:
            build = self._builds.get(version)
            now = time.monotonic()
            if build is not None and now < build.next_check:
                return build  # another thread looked while this one waited
            stamp = self._stamp(version)
            if build is not None and stamp == build.stamp:
                build = dataclasses.replace(build, next_check=now + self._check_seconds)
            else:
                build = self._build(version, stamp, build)
            self._builds[version] = build
            return build

    def _build(self, version: str, stamp: Stamp, before: Build | None) -> Build:
        next_check = time.monotonic() + self._check_seconds
        try:
            pipeline = build_pipeline(self.name, self._variant(version), self._root, self._timings)
        except (ValueError, OSError) as exc:
            reason = (
                f"pipeline {self.name!r} cannot prepare inputs for model "
                f"{self._spec.model.name!r} version {version}: {exc}"
            ).replace(str(self._root), "the repository")
            if before is not None and before.pipeline is not None:
                log.warning("%s; it keeps the files it was built from before", reason)
                return Build(before.pipeline, "", stamp, next_check)
            log.warning("%s", reason)
            return Build(None, reason, stamp, next_check)
        log.info("pipeline %s: built for model version %s", self.name, version)
        return Build(pipeline, "", stamp, next_check)

    def _variant(self, version: str) -> Pipeline:
        """The pipeline as `version` is fed: its files, its fingerprint, its inputs only."""
        steps = [_for_version(step, version, self._root) for step in self._spec.preprocess]
        model = self._spec.model.model_copy(
            update={"version": version, "routes": [], "shadow": None}
        )
        return self._spec.model_copy(update={"preprocess": steps, "model": model})

    def _stamp(self, version: str) -> Stamp:
        """The sizes and times of the files `version`'s build reads (and model.yaml's)."""
        paths = []
        for step in self._spec.preprocess:
            paths += [getattr(step, o).replace(VERSION, version) for o in _versioned(step)]
            paths += [step.model_yaml] if getattr(step, "model_yaml", None) else []
        return tuple(_stat(self._root / path) for path in paths)


def _versioned(step: StepSpec) -> list[str]:
    """The step's file options that name {version}."""
    return [o for o in FILE_OPTIONS if VERSION in (getattr(step, o, None) or "")]


def _for_version(step: StepSpec, version: str, root: Path) -> StepSpec:
    """`step` with `{version}` in its file options replaced; a standardize step that checks
    per-version stats against model.yaml gets the fingerprint it records for `version`."""
    update: dict[str, object] = {
        o: getattr(step, o).replace(VERSION, version) for o in _versioned(step)
    }
    if isinstance(step, StandardizeStep) and VERSION in step.stats and step.model_yaml:
        update |= {
            "fingerprint": recorded_fingerprint(root, step.model_yaml, version),
            "model_yaml": None,
        }
    return step.model_copy(update=update) if update else step


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _checked(pipeline: str, version: str) -> str:
    """The version a request names: 1 to 18 digits (the gateway names it for every arm)."""
    if not version:
        raise InvalidArgument(
            f"pipeline {pipeline!r} prepares inputs per model version: the request must name "
            f"the version in its {MODEL_VERSION!r} parameter"
        )
    if len(version) > MAX_VERSION_DIGITS or not (version.isascii() and version.isdigit()):
        raise InvalidArgument(
            f"model version {shown(version)} must be 1 to {MAX_VERSION_DIGITS} digits 0-9"
        )
    return version
