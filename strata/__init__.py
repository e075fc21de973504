"""Strata's shared package: codec, config, errors, server lifecycle, telemetry, stubs.

It imports no service; every service imports it.
"""

__version__ = "0.1.0"  # the one version string; pyproject.toml reads it
