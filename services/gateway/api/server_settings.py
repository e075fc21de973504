"""Triton's logging and trace extensions at the gateway: its log settings and its trace
settings, read by anyone and changed with the admin token, live.

The log settings are the level of the gateway's own logs. The trace settings are the share of
client requests traced: trace_rate N samples one in N new traces (the gateway decides for the
whole chain; the layers behind follow its decision), trace_level OFF samples none until
TIMESTAMPS turns it on again at the rate it had. They start from the config
(`telemetry.sample_ratio`); a setting sent as an empty list (null over REST) goes back to it,
and a Reload of a file whose sample_ratio changed sets them to the file's (the runtime
swaps the sampler; the edit wins, as an edit of route weights wins over SetWeights), so a
gateway of several processes, where this call is refused, changes them live too.
They are the server's, one for every pipeline: a pipeline's read gives the server's, and a
change for one pipeline is refused. Without an OTLP endpoint nothing is traced (trace_level
OFF) and nothing can be turned on; under OTEL_TRACES_SAMPLER the SDK samples, and the
settings say what the config asked.

Triton's log switches nest in Python's levels: the lowest switched on sets the level
(log_verbose_level > 0: DEBUG; else log_info: INFO; log_warning: WARNING; log_error: ERROR;
none: CRITICAL), and a level turns on every switch above it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from services.gateway.request import Caller
from services.gateway.runtime import Runtime
from strata.errors import InvalidArgument, NotFound, NotReady, listed, shown
from strata.security.bearer import ControlAuth
from strata.telemetry import tracing as telemetry

log = logging.getLogger(__name__)

LogValue = bool | int | str
TraceValue = list[str] | str | None
MAX_TRACE_RATE = 1_000_000
TRACE_FIXED = {
    "trace_mode": ["opentelemetry"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_file": [""],
}
TRACE_WHY = {
    "trace_mode": "spans go to the OTLP collector",
    "trace_count": "tracing goes on until trace_level is OFF",
    "log_frequency": "spans are exported as they end",
    "trace_file": "spans go to the OTLP collector, never to a file",
}
FIXED = {"log_file": "", "log_format": "json"}  # JSON lines on stderr, as every service logs
SWITCHES = (
    ("log_info", logging.INFO),
    ("log_warning", logging.WARNING),
    ("log_error", logging.ERROR),
)


class ServerSettings:
    def __init__(self, runtime: Runtime, auth: ControlAuth) -> None:
        self._runtime = runtime
        self._auth = auth
        self._tracing = self._set_from = self._configured

    def log(self) -> dict[str, LogValue]:
        """The gateway's log settings, as Triton names them."""
        level = logging.getLogger().getEffectiveLevel()
        switches = {name: level <= threshold for name, threshold in SWITCHES}
        return {**FIXED, **switches, "log_verbose_level": int(level <= logging.DEBUG)}

    def set_log(self, caller: Caller, changes: Mapping[str, LogValue]) -> dict[str, LogValue]:
        """Apply `changes` (admin token), each checked first; the settings after them."""
        if not changes:
            return self.log()
        self._auth.allow(caller.peer, caller.metadata)
        self._runtime.changing_live("a log setting")
        current = self.log()
        for key, value in changes.items():
            _check(key, value, current)
        merged = current | dict(changes)
        level = _level(merged)
        logging.getLogger().setLevel(level)
        log.warning("log level set to %s through the logging API", logging.getLevelName(level))
        return self.log()

    def trace(self, model: str = "") -> dict[str, list[str]]:
        """The trace settings (a pipeline's are the server's), as Triton names them."""
        pipelines = self._runtime.settings.pipelines
        if model and model not in pipelines:
            raise NotFound(f"unknown model {shown(model)}; pipelines: {listed(pipelines)}")
        tracing = self._in_force()
        off = not (tracing.on and telemetry.exporting())
        return {
            **TRACE_FIXED,
            "trace_level": ["OFF" if off else "TIMESTAMPS"],
            "trace_rate": [str(tracing.rate)],
        }

    def set_trace(
        self, caller: Caller, model: str, changes: Mapping[str, TraceValue]
    ) -> dict[str, list[str]]:
        """Apply `changes` (admin token), each checked first; the settings after them."""
        if not changes:
            return self.trace(model)
        self._auth.allow(caller.peer, caller.metadata)
        self._runtime.changing_live("a trace setting")
        if model:
            self.trace(model)  # NOT_FOUND for an unknown one
            raise InvalidArgument(
                "trace settings are the server's, one for every pipeline: change them "
                "without a model name"
            )
        tracing = self._in_force()
        for key, value in changes.items():
            tracing = _traced(tracing, key, _values(key, value), self._configured)
        if not telemetry.set_sample_ratio(tracing.ratio):
            raise NotReady(
                "traces cannot be turned on or off here: with no OTLP endpoint "
                "(telemetry.otlp_endpoint) they would go nowhere, and under "
                "OTEL_TRACES_SAMPLER the SDK samples"
            )
        self._tracing = tracing
        settings = self.trace()
        log.warning(
            "trace settings set to trace_level %s, trace_rate %s through the trace API",
            *settings["trace_level"],
            *settings["trace_rate"],
        )
        return settings

    @property
    def _configured(self) -> Tracing:
        return Tracing.of(self._runtime.settings.telemetry.sample_ratio)

    def _in_force(self) -> Tracing:
        """The settings in force: those last set here, unless a Reload has since brought
        another sample_ratio (which the runtime put in force)."""
        configured = self._configured
        if configured != self._set_from:
            self._tracing = self._set_from = configured
        return self._tracing


@dataclass(frozen=True)
class Tracing:
    """The trace settings: sample one in `rate` new traces while `on`."""

    rate: int
    on: bool

    @classmethod
    def of(cls, ratio: float) -> Tracing:
        """From the config's sample ratio (0: off, at a rate of 1 when turned on)."""
        return cls(max(1, round(1 / ratio)) if ratio > 0 else 1, ratio > 0)

    @property
    def ratio(self) -> float:
        return 1 / self.rate if self.on else 0.0


def _traced(tracing: Tracing, key: str, values: list[str], configured: Tracing) -> Tracing:
    """`tracing` with one setting changed (to the config's where `values` is empty)."""
    if key == "trace_rate":
        rate = configured.rate if not values else _rate(values)
        return replace(tracing, rate=rate)
    if key == "trace_level":
        return replace(tracing, on=configured.on if not values else _level_on(values))
    if key in TRACE_FIXED:
        if values and values != TRACE_FIXED[key]:
            raise InvalidArgument(
                f"{key} cannot change: it is {TRACE_FIXED[key][0]!r} ({TRACE_WHY[key]})"
            )
        return tracing
    known = sorted([*TRACE_FIXED, "trace_level", "trace_rate"])
    raise InvalidArgument(f"unknown trace setting {shown(key)}; settings: {known}")


def _rate(values: list[str]) -> int:
    text = values[0] if len(values) == 1 else ""
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_TRACE_RATE:
        raise InvalidArgument(
            f"trace_rate must be one whole number from 1 to {MAX_TRACE_RATE} (one in N "
            f"requests traced), got {[shown(v) for v in values]}"
        )
    return int(text)


def _level_on(values: list[str]) -> bool:
    if values == ["OFF"]:
        return False
    if values == ["TIMESTAMPS"]:
        return True
    raise InvalidArgument(
        f'trace_level must be ["OFF"] or ["TIMESTAMPS"] (spans carry times and '
        f"shapes, never tensor values), got {[shown(v) for v in values]}"
    )


def _values(key: str, value: TraceValue) -> list[str]:
    """A setting's values as Triton's gRPC sends them: REST's null is [], a string one."""
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise InvalidArgument(f"trace setting {shown(key)} takes a string or a list of strings")
    return values


def _check(key: str, value: LogValue, current: Mapping[str, LogValue]) -> None:
    if key not in current:
        raise InvalidArgument(f"unknown log setting {shown(key)}; settings: {sorted(current)}")
    wanted = type(current[key])
    if type(value) is not wanted:
        raise InvalidArgument(f"log setting {key} must be of type {wanted.__name__}")
    if key in FIXED and value != FIXED[key]:
        raise InvalidArgument(
            f"{key} cannot change: the gateway logs JSON lines to stderr ({FIXED[key]!r})"
        )


def _level(settings: Mapping[str, LogValue]) -> int:
    if settings["log_verbose_level"]:
        return logging.DEBUG
    on = [threshold for name, threshold in SWITCHES if settings[name]]
    return min(on, default=logging.CRITICAL)
