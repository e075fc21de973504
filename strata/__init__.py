"""Strata, the one installed package: its shared modules (codec, config, errors, server
life-cycle, telemetry, stubs), one sub-package per service (gateway, preprocess, inference,
postprocess), the converter and the `strata` command.

The shared modules import no service; every service imports them.
"""

__version__ = "0.1.0"  # the one version string; pyproject.toml reads it
