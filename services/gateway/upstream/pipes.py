"""The gateway's end of the pipes (strata.rpc.pipes): a lane to a layer of this host opens on
the layer's pipe where the layer has one, over the layer's gRPC channel otherwise.

A lane looks for the pipe of the address it would dial, in this user's own pipe folder
(mode 0700: no other user can have put a socket there), and uses it only once the server
there says it listens on that address. Where the pipe cannot be opened (the layer restarted
without one, the folder is not this user's), its lanes go over gRPC for REST_SECONDS, then
look again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.gateway.metrics import LANES_OPENED
from services.gateway.upstream.lanes import Answer, Reply, Request, StreamMethod
from strata.config.server import PipeSettings
from strata.rpc.pipes import PipeCall, own_folder, pipe_folder, pipe_path

log = logging.getLogger(__name__)

REST_SECONDS = 30.0


class Pipes:
    """Where lanes look for pipes, and the most one message may carry."""

    def __init__(self, settings: PipeSettings, max_message_bytes: int) -> None:
        self._enabled = settings.enabled
        self._folder = pipe_folder(settings.root)
        self._limit = max_message_bytes

    def lanes_to(
        self,
        method: StreamMethod[Request, Answer, Reply],
        hop: str,
        service: str,
        address: str,
    ) -> StreamMethod[Request, Answer, Reply]:
        """`method` with its lanes to `address` opened on its pipe where there is one, each
        counted by transport."""
        return dataclasses.replace(
            method, open=_Opener(self, method, hop, f"/{service}/{method.name}", address)
        )

    def call(
        self,
        path: Path,
        method: str,
        answer: type[Answer],
        address: str,
        refused: Callable[[str], None],
    ) -> PipeCall[Answer] | None:
        """A stream on the pipe at `path`, where pipes are on and this user's folder holds
        one; else None."""
        if not self._enabled or not own_folder(self._folder, create=False) or not path.exists():
            return None
        return PipeCall(path, method, answer, address, self._limit, refused)

    def path(self, address: str) -> Path:
        return pipe_path(self._folder, address)


class _Opener:
    """Opens a lane's stream: on the pipe unless it failed lately, else over gRPC."""

    def __init__(
        self,
        pipes: Pipes,
        method: StreamMethod[Any, Any, Any],
        hop: str,
        path: str,
        address: str,
    ) -> None:
        self._pipes = pipes
        self._grpc = method.open
        self._answer = method.answer
        self._hop = hop
        self._method = path
        self._address = address
        self._socket = pipes.path(address)
        self._rests_until = 0.0

    def __call__(self) -> Any:
        if time.monotonic() >= self._rests_until:
            call = self._pipes.call(
                self._socket, self._method, self._answer, self._address, self._refused
            )
            if call is not None:
                LANES_OPENED.labels(self._hop, "pipe").inc()
                return call
        LANES_OPENED.labels(self._hop, "grpc").inc()
        return self._grpc()

    def _refused(self, why: str) -> None:
        self._rests_until = time.monotonic() + REST_SECONDS
        log.warning(
            "%s: pipe unusable (%s); lanes over gRPC for %.0fs", self._hop, why, REST_SECONDS
        )
