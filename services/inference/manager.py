"""Which model versions serve, and replacing them under load (the repository extension).

A load reads model.yaml, picks the versions its policy names, and loads each new or changed
one beside those serving: open, run its validation cases, warm. Only when every one of them
has passed does the model's set of serving versions switch, in one assignment; requests that
were already queued on a replaced version still run on it, and its session is released once
its last batch has finished. If any version fails, nothing switches: the versions serving
keep serving, and the error names the version and the failing case. A version loaded after
start is also checked against the pipelines that call it (rewiring.py). Each step is told to
the repository index (index.py), which RepositoryIndex answers from.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.inference.index import IndexEntry, RepositoryIndex
from services.inference.manifest import ModelSpec, read_spec
from services.inference.metrics import LOAD_FAILURES
from services.inference.model import ModelVersion, load_version
from services.inference.rewiring import Rewiring
from services.inference.statistics import VersionStats
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument, NotFound, NotReady, StrataError, shown
from strata.models import repository
from strata.shapes.folding import Fold

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 255  # a model name is a folder name: the longest most filesystems allow
MAX_VERSION_DIGITS = 18  # a version is a folder's number; any of 18 digits fits in an int64


@dataclass(frozen=True)
class Served:
    """The versions of one model serving now; replaced whole, never changed in place."""

    versions: dict[int, ModelVersion]

    @property
    def latest(self) -> ModelVersion:
        return self.versions[max(self.versions)]


class ModelManager:
    """The serving versions of every model, their loads, unloads and polls."""

    def __init__(
        self,
        root: Path,
        settings: InferenceSettings,
        executor: Executor,
        rewiring: Rewiring | None = None,
        folds: Mapping[str, Fold] | None = None,
    ) -> None:
        """`settings`: the deployment's copy, whose `models` lists the models it loads."""
        assert isinstance(settings.models, list)  # app.build makes that copy
        self.configured = settings.models
        self._root = root
        self._folds = dict(folds or {})  # model -> the pipelines' tail it runs (folding.py)
        self._rewiring = rewiring or Rewiring({})
        self._settings = settings
        self._executor = executor
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-loader")
        self._served: dict[str, Served] = {}
        self._index = RepositoryIndex()
        self._bad: dict[str, set[str]] = defaultdict(set)  # fingerprints that failed to load
        self._unloaded: set[str] = set()
        self._spec_errors: dict[str, str] = {}  # the last bad model.yaml poll reported
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load every configured model (any failure stops start-up), then poll if asked."""
        for name in self.configured:
            await self.load(name)
        self._rewiring.started({n: s.versions.values() for n, s in self._served.items()})
        if self._settings.poll_seconds > 0:
            self._poller = asyncio.create_task(self._poll(self._settings.poll_seconds))

    async def close(self) -> None:
        """Stop polling; every version finishes what it holds and is released."""
        if self._poller is not None:
            self._poller.cancel()
        served, self._served = self._served, {}
        await asyncio.gather(*(v.retire() for s in served.values() for v in s.versions.values()))
        self._loader.shutdown(wait=True)

    def resolve(self, name: str, version: str = "") -> ModelVersion:
        """The version that answers a request for `name` (the highest when none is named)."""
        served = self._served.get(name)
        if served is None:
            raise self._not_serving(checked_name(name))
        if not version:
            return served.latest
        found = served.versions.get(checked_version(version))
        if found is None:
            raise NotFound(
                f"model {name!r} has no version {version!r} serving "
                f"(serving {', '.join(map(str, sorted(served.versions)))})"
            )
        return found

    def serving(self) -> dict[str, list[str]]:
        """Each served model's versions."""
        return {name: [str(v) for v in sorted(s.versions)] for name, s in self._served.items()}

    def ready(self, name: str, version: str = "") -> bool:
        try:
            self.resolve(name, version)
        except StrataError:
            return False
        return True

    def statistics(self, name: str = "", version: str = "") -> list[VersionStats]:
        """The numbers of the serving versions: all, one model's, or one version's."""
        if not name:
            return [v.stats for s in self._served.values() for v in s.versions.values()]
        if version:
            return [self.resolve(name, version).stats]
        served = self._served.get(name)
        if served is None:
            raise self._not_serving(checked_name(name))
        return [served.versions[v].stats for v in sorted(served.versions)]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model in the repository, with each known version's state and reason."""
        return self._index.entries([*repository.models(self._root), *self._served], ready_only)

    async def load(self, name: str) -> None:
        """Load or reload `name` from the repository; NotReady if a version must not serve."""
        folder = self._root / checked_name(name)
        if not folder.is_dir():
            raise NotFound(f"model {name!r} is not in the repository (it has no folder {name}/)")
        async with self._locks[name]:
            self._unloaded.discard(name)
            await self._load(name, folder)

    async def unload(self, name: str) -> None:
        """Stop serving every version of `name` once their queued requests have finished."""
        if name not in self._served and not (self._root / checked_name(name)).is_dir():
            # Before taking the model's lock: a lock for every unknown name would pile up.
            raise NotFound(f"model {name!r} is not in the repository (it has no folder {name}/)")
        async with self._locks[name]:
            served = self._served.pop(name, None)
            self._unloaded.add(name)
            self._index.model_cleared(name)
            await self._retire(name, list((served.versions if served else {}).values()))
        log.info("model %s unloaded", name)

    async def _load(self, name: str, folder: Path) -> None:
        try:
            spec = read_spec(folder / "model.yaml", self._settings)
            available = repository.versions(folder)
            wanted = spec.version_policy.select(list(available))
            if not wanted:
                raise NotReady(
                    f"no version folder matches the version policy (found {sorted(available)})"
                )
        except StrataError as exc:
            self._index.model_refused(name, str(exc))
            raise NotReady(f"model {name!r}: {exc}") from None
        self._index.model_cleared(name)
        prints = {v: repository.fingerprint(available[v], spec.stamp(v)) for v in wanted}
        current = self._served.get(name)
        keep = {
            v: m
            for v, m in (current.versions if current else {}).items()
            if v in prints and m.fingerprint == prints[v]
        }
        fresh = [v for v in wanted if v not in keep]
        if current is not None and not fresh and len(keep) == len(current.versions):
            return
        loaded = await self._load_versions(name, spec, available, prints, fresh, current)
        self._switch(name, Served({**keep, **loaded}))
        self._bad[name].clear()  # what failed before is no longer wanted or now loads
        replaced = [m for v, m in (current.versions if current else {}).items() if v not in keep]
        await self._retire(name, replaced)
        self._forget_missing(name, available)

    async def _load_versions(
        self,
        name: str,
        spec: ModelSpec,
        available: dict[int, Path],
        prints: dict[int, str],
        fresh: list[int],
        current: Served | None,
    ) -> dict[int, ModelVersion]:
        loop = asyncio.get_running_loop()
        loaded: dict[int, ModelVersion] = {}
        for v in fresh:
            self._index.loading(name, v)
            LOAD_FAILURES.labels(name, str(v)).inc(0)  # the series exists before any failure
            try:
                loaded[v] = await loop.run_in_executor(
                    self._loader,
                    load_version,
                    available[v],
                    name,
                    v,
                    spec,
                    self._executor,
                    prints[v],
                    self._folds.get(name),
                )
                self._rewiring.check(loaded[v])
            except Exception as exc:
                await asyncio.gather(*(m.retire() for m in loaded.values()))
                raise self._failed(name, v, prints[v], exc, current) from None
        return loaded

    def _failed(
        self, name: str, version: int, print_: str, exc: Exception, current: Served | None
    ) -> NotReady:
        if not isinstance(exc, StrataError):
            log.error("loading model %s version %s failed", name, version, exc_info=exc)
        # An unexpected error's text may name server paths: the log has it, callers do not.
        reason = str(exc) if isinstance(exc, StrataError) else f"{type(exc).__name__} (see the log)"
        self._bad[name].add(print_)
        LOAD_FAILURES.labels(name, str(version)).inc()
        self._index.refused(name, version, reason)
        self._index.ready(name, current.versions if current else {})
        keeps = f"; version {current.latest.version} keeps serving" if current else ""
        log.warning("model %s version %s refused: %s", name, version, reason)
        return NotReady(f"model {name!r} version {version} refused: {reason}{keeps}")

    def _switch(self, name: str, served: Served) -> None:
        previous = self._served.get(name)
        self._served[name] = served  # the switch: new requests reach the new versions now
        self._index.ready(name, served.versions)
        log.info(
            "model %s serves versions %s (was %s)",
            name,
            sorted(served.versions),
            sorted(previous.versions) if previous else "none",
        )

    async def _retire(self, name: str, versions: list[ModelVersion]) -> None:
        """Let `versions` finish their queues and release them; a version number that serves
        again (its files changed and it reloaded) keeps its READY entry."""
        serving = self._served.get(name)
        gone = [m for m in versions if serving is None or m.version not in serving.versions]
        for m in gone:
            self._index.unloading(name, m.version)
        await asyncio.gather(*(m.retire() for m in versions))
        for m in gone:
            self._index.unloaded(name, m.version)

    def _forget_missing(self, name: str, available: dict[int, Path]) -> None:
        """Forget the index entries of version folders that are gone and not serving."""
        serving = self._served.get(name)
        self._index.forget_others(name, set(available) | set(serving.versions if serving else ()))

    def _not_serving(self, name: str) -> StrataError:
        if self._index.knows(name) or (repository.is_name(name) and (self._root / name).is_dir()):
            return NotReady(f"model {name!r} is not loaded; load it with RepositoryModelLoad")
        return NotFound(f"unknown model {name!r}; serving {sorted(self._served)}")

    async def _poll(self, interval: float) -> None:
        """Pick up new or changed versions of every loaded model."""
        while True:
            await asyncio.sleep(interval)
            for name in list(self._served):
                try:
                    if self._changed(name):
                        async with self._locks[name]:
                            await self._load(name, self._root / name)
                except StrataError as exc:
                    log.warning("poll: %s", exc)
                except Exception:
                    log.exception("poll of model %s failed", name)

    def _changed(self, name: str) -> bool:
        """Whether the versions `name` should serve differ from those serving (versions that
        already failed to load do not count until their files change)."""
        folder = self._root / name
        served = self._served.get(name)
        if served is None or name in self._unloaded:
            return False
        try:
            spec = read_spec(folder / "model.yaml", self._settings)
        except StrataError as exc:
            if self._spec_errors.get(name) != str(exc):
                self._spec_errors[name] = str(exc)
                log.warning("poll: model %s keeps serving; %s", name, exc)
            return False
        self._spec_errors.pop(name, None)
        available = repository.versions(folder)
        wanted = spec.version_policy.select(list(available))
        prints = {repository.fingerprint(available[v], spec.stamp(v)) for v in wanted}
        serving = {m.fingerprint for m in served.versions.values()}
        new = prints - serving
        return bool(wanted) and prints != serving and not (new and new <= self._bad[name])


def checked_name(name: str) -> str:
    """A model name that is one plain folder name; InvalidArgument naming the rule if not."""
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"model name {shown(name)} is longer than the limit of {MAX_NAME_LENGTH}"
        )
    return repository.check_name(name)


def checked_version(version: str) -> int:
    """A requested version's number; InvalidArgument unless it is 1 to 18 digits 0-9."""
    if len(version) > MAX_VERSION_DIGITS or not (version.isascii() and version.isdigit()):
        raise InvalidArgument(
            f"model version {shown(version)} must be 1 to {MAX_VERSION_DIGITS} digits 0-9"
        )
    return int(version)
