"""One served model version: its ONNX Runtime session, its signature and its batcher.

A version is opened, checked against its validation cases and warmed before anything can
reach it; a request never pays for a load. When it is replaced or unloaded, it stops taking
requests, finishes those it holds, and only then lets go of its session.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
from opentelemetry.trace import SpanContext

from services.inference import assemble, buckets, validation
from services.inference.batcher import Batcher
from services.inference.jobs import Request
from services.inference.manifest import ModelSpec
from services.inference.sequence_graph import check_model
from services.inference.signature import Signature
from services.inference.statistics import VersionStats
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument, NotReady, StrataError, Unavailable
from strata.models.normalisation import STATS_FILE, load_stats
from strata.models.onnxsig import TensorInfo
from strata.shapes.folding import Fold
from strata.wire.codec import Arrays

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
# What ONNX Runtime raises for inputs it cannot take (its INVALID_ARGUMENT status, e.g. an
# index out of range; the binding's own checks of the feed): the request's fault. Anything
# else (FAIL, RUNTIME_EXCEPTION, out of memory, ...) is the model failing, which another
# replica or arm may not: UNAVAILABLE, so the gateway's breaker counts it and fails over.
_INPUT_ERRORS = (ort_errors.InvalidArgument, ValueError, TypeError)
_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def providers(preferred: Sequence[str]) -> list[str]:
    """The preferred execution providers this ONNX Runtime build has, CPU always last."""
    available = set(ort.get_available_providers())
    chosen = [name for name in preferred if name in available and name != CPU]
    return [*chosen, CPU]


def session_options(settings: InferenceSettings.Session) -> ort.SessionOptions:
    """ONNX Runtime session options from the model's session settings."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = _LEVELS[settings.graph_optimization]
    spinning = "1" if settings.allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    return options


def open_session(
    path: Path, settings: InferenceSettings.Session, tail: Fold | None = None
) -> ort.InferenceSession:
    """An ONNX Runtime session on `path`, with a pipeline's folded `tail` in front where
    given (fold.py); NotReady says why when the file cannot be used."""
    # The repository's own path, model/version/file: never the server's path to it.
    where = f"{path.parent.parent.name}/{path.parent.name}"
    if not path.is_file():
        raise NotReady(f"{path.name} is missing from {where}")
    model: str | bytes = str(path)
    if tail is not None:
        # Here, not at the top: fold.py needs the onnx package, some 30 ms of a start that
        # folds nothing (ONNX Runtime reads the models by itself).
        from services.inference import fold

        model = fold.folded(path, tail)
    try:
        return ort.InferenceSession(
            model,
            sess_options=session_options(settings),
            providers=providers(settings.execution_providers),
        )
    except Exception as exc:  # ONNX Runtime raises its own exception types for bad files
        reason = _first_line(exc).replace(str(path.parent), where)
        raise NotReady(f"cannot open {path.name}: {reason}") from None


class ModelVersion:
    """A model version ready to serve: one session, reused for every batch."""

    def __init__(
        self,
        name: str,
        version: int,
        spec: ModelSpec,
        session: ort.InferenceSession,
        executor: Executor,
        fingerprint: str,
    ) -> None:
        self.name = name
        self.version = version
        self.spec = spec
        self.fingerprint = fingerprint
        self._session: ort.InferenceSession | None = session
        self.signature = Signature(
            name,
            [TensorInfo.of(arg) for arg in session.get_inputs()],
            [TensorInfo.of(arg) for arg in session.get_outputs()],
            spec.max_batch_size,
            spec.padding,
        )
        self.providers = session.get_providers()
        self._pads = buckets.buckets_of(self.signature)
        self._buckets: buckets.Buckets | None = None
        self.stats = VersionStats(
            name, str(version), queue_capacity_rows=spec.batching.max_queue_rows
        )
        max_rows = spec.max_batch_size if self.signature.batchable else 1
        batching = spec.batching
        if self._pads is not None:
            # Each row's padding is cut off before it runs, so padding costs a batch nothing
            # and any lengths may share one: the more rows, the fewer calls buckets need.
            batching = batching.model_copy(update={"max_padding": 1.0})
        self.batcher = Batcher(
            f"model {name!r} version {version}",
            self.run_requests,
            executor,
            batching,
            max_rows,
            spec.concurrency,
            self.stats,
        )

    @property
    def max_batch_size(self) -> int:
        """Triton's convention: 0 for a model that does not batch."""
        return self.spec.max_batch_size if self.signature.batchable else 0

    async def infer(
        self, arrays: Arrays, request: Request, link: SpanContext | None = None
    ) -> Arrays:
        """Check the request, queue it, and return its outputs."""
        rows, key = self.signature.check(arrays)
        arrays = self.signature.strings(arrays)
        levels = self.spec.batching.priority_levels
        if not 0 <= request.priority <= levels:
            raise InvalidArgument(
                f"priority {request.priority} is outside 0..{levels} for model {self.name!r}"
            )
        if not self.signature.batchable and not request.skip_batching:
            request = Request(request.priority, request.deadline, skip_batching=True)
        length = self.signature.padded_length(arrays)
        return await self.batcher.submit(arrays, rows, key, request, length, link)

    def run(self, arrays: Arrays) -> Arrays:
        """Run the session once (blocking: call it from a worker thread)."""
        session = self._session
        if session is None:
            raise NotReady(f"model {self.name!r} version {self.version} is unloaded")
        names = self.signature.output_names
        try:
            results = session.run(names, arrays)
        except Exception as exc:  # ONNX Runtime's own exception types
            raise self._run_error(exc) from None
        return dict(zip(names, results, strict=True))

    def _run_error(self, exc: Exception) -> StrataError:
        label = f"model {self.name!r} version {self.version}"
        if isinstance(exc, _INPUT_ERRORS):
            return InvalidArgument(f"{label} cannot run the request: {_first_line(exc)}")
        return Unavailable(f"{label} failed while running: {_first_line(exc)}")

    def run_requests(self, requests: Sequence[Arrays]) -> list[Arrays]:
        """Run requests as one batch, in buckets of like length where the model pads
        (buckets.py), and split the answers (blocking)."""
        if len(requests) == 1 and self._buckets is None:
            return [self.run(requests[0])]
        batch, slots = assemble.merge(self.signature, requests)
        outputs = self.run(batch) if self._buckets is None else self._buckets.run(batch, self.run)
        return assemble.split(self.signature, outputs, slots)

    def bucket(self) -> None:
        """Run batches in buckets of like length from now on, where the model pads along a
        dimension its answers do not have; the cost of a call timed here (blocking)."""
        if self._pads is not None:
            costs = buckets.calibrate(self.signature, self._pads, self.run)
            self._buckets = buckets.Buckets(self._pads, costs)
            # What a padded batch costs hangs on this fit, made once per process: logged, so
            # two processes' plans can be compared.
            log.info("model %s version %s runs in buckets: %s", self.name, self.version, costs)

    @property
    def bucket_costs(self) -> buckets.Costs | None:
        """The fitted costs its batches are split by; None where they run whole."""
        return None if self._buckets is None else self._buckets.costs

    async def retire(self) -> None:
        """Stop taking requests, finish the queued and running ones, release the session."""
        self.batcher.close()
        await self.batcher.drained()
        self._session = None


def load_version(
    folder: Path,
    name: str,
    version: int,
    spec: ModelSpec,
    executor: Executor,
    fingerprint: str,
    tail: Fold | None = None,
) -> ModelVersion:
    """Open, validate and warm one version folder (blocking). NotReady if it must not serve.
    `tail`: the normalize (and layout) steps of the pipelines feeding it, which it runs in
    front of its graph (strata/shapes/folding.py)."""
    check_statistics(folder, spec.trained_stats(version))
    path = folder / "model.onnx"
    cases = validation.read_cases(folder / "validation")
    checked = len(cases)
    if tail is None or cases:
        model = _opened(path, name, version, spec, executor, fingerprint)
        validation.validate(model.signature, model.run_requests, cases)
    if tail is not None:
        # The golden cases take the file's own inputs; the folded model takes the pipeline's.
        model = _opened(path, name, version, spec, executor, fingerprint, tail=tail)
        cases = []
    for rows, seconds in validation.warm(model.signature, model.run_requests, cases):
        model.batcher.execution.observe(rows, seconds)
        model.batcher.compute.observe(rows, seconds)
    log.info(
        "model %s version %s ready on %s (%d validation cases%s)",
        name,
        version,
        model.providers[0],
        checked,
        "" if tail is None else f", folded: takes UINT8 {tail.source!r}",
    )
    return model


def _opened(
    path: Path,
    name: str,
    version: int,
    spec: ModelSpec,
    executor: Executor,
    fingerprint: str,
    *,
    tail: Fold | None = None,
) -> ModelVersion:
    session = open_session(path, spec.session, tail)
    try:
        model = ModelVersion(name, version, spec, session, executor, fingerprint)
        check_model(model.signature, spec.sequence)
    except InvalidArgument as exc:
        raise NotReady(str(exc)) from None
    model.bucket()
    return model


def check_statistics(folder: Path, trained: str | None) -> None:
    """NotReady unless the statistics a version folder carries are those its model was
    trained with (model.yaml's preprocess_fingerprint): preprocess would feed it others."""
    path = folder / STATS_FILE
    if trained is None or not path.is_file():
        return
    where = f"{folder.parent.name}/{folder.name}/{STATS_FILE}"
    try:
        stats = load_stats(path)
    except (ValueError, OSError) as exc:
        reason = _first_line(exc).replace(f"{path}: ", "").replace(str(path), where)
        raise NotReady(f"cannot read {where}: {reason}") from None
    if stats.fingerprint != trained:
        raise NotReady(
            f"{where} has fingerprint {stats.fingerprint}, but model.yaml records {trained} "
            f"for version {folder.name} (the statistics it was trained with)"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
