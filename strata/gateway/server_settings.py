"""Triton's logging and trace extensions at the gateway: its log settings, read by anyone and
changed with the admin token (the level of the gateway's own logs, live), and its trace
settings, read from the config (`telemetry.sample_ratio`), which changes only by restart.

Triton's log switches nest in Python's levels: the lowest switched on sets the level
(log_verbose_level > 0: DEBUG; else log_info: INFO; log_warning: WARNING; log_error: ERROR;
none: CRITICAL), and a level turns on every switch above it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from strata.errors import InvalidArgument, NotFound, Unimplemented, shown
from strata.gateway.caller import Caller
from strata.gateway.runtime import Runtime
from strata.tokens import ControlAuth

log = logging.getLogger(__name__)

LogValue = bool | int | str
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
        if model and model not in self._runtime.settings.pipelines:
            raise NotFound(f"unknown model {shown(model)}")
        ratio = self._runtime.settings.telemetry.sample_ratio
        return {
            "trace_mode": ["opentelemetry"],
            "trace_level": ["TIMESTAMPS" if ratio > 0 else "OFF"],
            "trace_rate": [str(round(1 / ratio)) if ratio > 0 else "0"],
            "trace_count": ["-1"],
            "log_frequency": ["0"],
            "trace_file": [""],
        }

    def set_trace(self, model: str, changes: Mapping[str, list[str]]) -> dict[str, list[str]]:
        """Only a read (no changes) is offered."""
        if changes:
            raise Unimplemented(
                "trace settings do not change live: set telemetry.sample_ratio in the config "
                "(or OTEL_TRACES_SAMPLER) and restart; traces go to the OTLP collector"
            )
        return self.trace(model)


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
