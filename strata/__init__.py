"""Strata's shared package: codec, config, errors, server lifecycle, telemetry, stubs.

It imports no service; every service imports it.
"""
