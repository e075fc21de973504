"""The repository index: what the RepositoryIndex RPC says of every model and version.

The model manager tells it each step of a load, a refusal, a switch and a release; it keeps
one state and reason per model version (and one for a model whose model.yaml or version
policy was refused), and lists them as v2 `RepositoryIndexResponse` lines. A model it has no
line for is listed as UNAVAILABLE, "not loaded".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from strata.proto.inference import grpc_service_pb2 as v2

READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
MODEL = ""  # the version key of the line about the model as a whole


@dataclass(frozen=True)
class IndexEntry:
    """One line of the repository index."""

    name: str
    version: str  # "" for the model as a whole
    state: str
    reason: str = ""


class RepositoryIndex:
    """The state and reason of every model version the manager has loaded or tried to."""

    def __init__(self) -> None:
        # model -> version ("" for the model) -> (state, reason)
        self._states: defaultdict[str, dict[str, tuple[str, str]]] = defaultdict(dict)

    def knows(self, name: str) -> bool:
        """Whether `name` has been loaded, refused or unloaded here."""
        return name in self._states

    def entries(self, names: Iterable[str], ready_only: bool = False) -> list[IndexEntry]:
        """The lines of `names`, by name and then version (the model's own line first)."""
        entries = []
        for name in sorted(set(names)):
            known = self._states.get(name) or {MODEL: (UNAVAILABLE, "not loaded")}
            entries += [IndexEntry(name, v, *known[v]) for v in sorted(known, key=_order)]
        return [e for e in entries if e.state == READY or not ready_only]

    def model_refused(self, name: str, reason: str) -> None:
        """`name`'s model.yaml or version policy was refused: no version can load."""
        self._states[name][MODEL] = (UNAVAILABLE, reason)

    def model_cleared(self, name: str) -> None:
        """`name`'s model.yaml passed, or the model was unloaded: its own line goes."""
        self._states[name].pop(MODEL, None)

    def loading(self, name: str, version: int) -> None:
        self._states[name][str(version)] = (LOADING, "")

    def ready(self, name: str, versions: Iterable[int]) -> None:
        """`versions` of `name` serve."""
        for v in versions:
            self._states[name][str(v)] = (READY, "")

    def refused(self, name: str, version: int, reason: str) -> None:
        """`version` of `name` failed to load, open, validate or warm."""
        self._states[name][str(version)] = (UNAVAILABLE, reason)

    def unloading(self, name: str, version: int) -> None:
        self._states[name][str(version)] = (UNLOADING, "")

    def unloaded(self, name: str, version: int) -> None:
        self._states[name][str(version)] = (UNAVAILABLE, "unloaded")

    def forget_others(self, name: str, keep: set[int]) -> None:
        """Forget `name`'s version lines but those of `keep` (the model's own line stays)."""
        states = self._states[name]
        for key in [k for k in states if k != MODEL and int(k) not in keep]:
            del states[key]


def index_response(entries: Iterable[IndexEntry]) -> v2.RepositoryIndexResponse:
    return v2.RepositoryIndexResponse(
        models=[
            v2.RepositoryIndexResponse.ModelIndex(
                name=e.name, version=e.version, state=e.state, reason=e.reason
            )
            for e in entries
        ]
    )


def _order(key: str) -> int:
    return int(key) if key else -1
