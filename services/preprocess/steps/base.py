"""The registry that builds steps from config, and the file option steps share.

The step interface and its helpers are public, in strata.plugins: the built-in steps use
the same API as the user's own.
"""

from __future__ import annotations

from pathlib import Path

from strata.config import preprocess as options
from strata.config.preprocess import StepSpec
from strata.plugins import Step
from strata.registry import Registry, guard_step

__all__ = ["STEPS", "resolve"]


STEPS: Registry[StepSpec, Step] = Registry("preprocess step", options.Step, Step, guard_step)


def resolve(base_dir: Path, relative: str) -> Path:
    """A file option, relative to the folder the deployment keeps models in."""
    path = base_dir / relative
    if not path.is_file():
        raise ValueError(f"file {relative!r} not found under {base_dir}")
    return path
