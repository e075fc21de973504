"""Each request to a pipeline counted and timed, whether it answers or fails: by pipeline,
status code and protocol in the metrics, and in the pipeline's v2 statistics. A request that
fails by the server's own fault (FAILED_PRECONDITION: a pipeline that does not make what it
declares) marks its pipeline faulted, not ready, until one of its requests answers again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from services.gateway.flow.statistics import STATISTICS
from services.gateway.metrics import LATENCY, REQUESTS
from strata.errors import status_of
from strata.proto.inference import grpc_service_pb2 as v2

UNKNOWN = "(unknown)"  # the label of a name no pipeline has, so clients cannot grow the metrics


@dataclass
class Count:
    """A counted request's answer, None until it has one."""

    response: v2.ModelInferResponse | None = None

    def answered(self, response: v2.ModelInferResponse) -> v2.ModelInferResponse:
        self.response = response
        return response


class Counting:
    def __init__(self, known: Callable[[str], bool]) -> None:
        self._known = known
        self._faulted: set[str] = set()

    def faulted(self, name: str) -> bool:
        """Whether pipeline `name`'s last request failed by the server's fault."""
        return name in self._faulted

    @contextmanager
    def counted(self, name: str, protocol: str) -> Iterator[Count]:
        """The block's request for pipeline `name`, counted and timed by pipeline, status code
        and protocol, and in the pipeline's statistics, whether it answers or fails."""
        started = time.monotonic()
        code = "OK"
        count = Count()
        try:
            yield count
        except Exception as exc:
            code = status_of(exc)[0].name
            raise
        finally:
            known = self._known(name)
            seconds = time.monotonic() - started
            REQUESTS(name if known else UNKNOWN, code, protocol).inc()
            LATENCY(name if known else UNKNOWN, protocol).observe(seconds)
            if known:
                STATISTICS.finished(name, seconds, count.response)
                self._note_fault(name, code, count)

    def _note_fault(self, name: str, code: str, count: Count) -> None:
        if code == grpc.StatusCode.FAILED_PRECONDITION.name:
            self._faulted.add(name)
        elif count.response is not None:
            self._faulted.discard(name)
