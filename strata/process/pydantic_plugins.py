"""pydantic's own plugins off in Strata's processes, unless the environment says otherwise.

The first model pydantic builds in a process has it read the entry points of every installed
distribution, looking for plugins of its own (the `pydantic` group): some 50 ms of CPU in
every process's start, for plugins Strata does not use. pydantic reads the variable each time
it builds a model, so this is imported before any model is built: first thing in the
services' package (services/__init__.py) and in the launcher. An operator who uses such a
plugin sets PYDANTIC_DISABLE_PLUGINS themselves (set empty, every plugin loads).
"""

from __future__ import annotations

import os

os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
