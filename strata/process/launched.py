"""How a launcher tells its own children from other processes on the same ports.

The launcher (strata/tools/launch.py) puts an id of its own in its children's environment; each
child reports health service `strata.launch.<id>` SERVING (strata/rpc/server.py), so SERVING from
another deployment's process on the same port is not taken for this deployment up. A module
of its own so that the launcher can start its children before it imports the serving stack.
"""

from __future__ import annotations

import os

LAUNCH_ID = "STRATA_LAUNCH_ID"


def launch_service(launch_id: str) -> str:
    """The health service name the children of launcher `launch_id` report."""
    return f"strata.launch.{launch_id}"


def launched_by() -> list[str]:
    """The health service this process reports for the launcher that started it, if any."""
    launch_id = os.environ.get(LAUNCH_ID)
    return [launch_service(launch_id)] if launch_id else []
