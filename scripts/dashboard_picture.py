"""Draw the Strata dashboard from a real run: docs/images/dashboard.png (docs/operating.md).

Starts the default system and a real Prometheus scraping it (Debian's `prometheus` package;
tests/support/prometheus.py), sends a minute of load that rises and falls, with a bad request
and a refused one every few seconds, then asks Prometheus for every panel's queries over that
minute and draws them as the dashboard lays them out (deploy/grafana/dashboards/strata.json).

    .venv/bin/python scripts/dashboard_picture.py [--seconds 60] [--out docs/images/dashboard.png]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import time
from pathlib import Path

import grpc
import matplotlib.pyplot as plt

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.prometheus import (
    DASHBOARD,
    Prometheus,
    running_prometheus,
    send_bad,
    send_load,
    send_refused,
    watched,
)
from tests.support.system import ROOT, running_system

RATE_WINDOW = "10s"  # Grafana's $__rate_interval at a 1 s scrape over a short range
UNITS = {"s": "seconds", "reqps": "requests/s", "bytes": "bytes", "percentunit": "share"}


def drive(stub: v2_grpc.GRPCInferenceServiceStub, seconds: float) -> None:
    """Load that rises and falls (2 to 30 requests a second), a bad and a refused request
    every 10 seconds."""
    sent, started, faults = 0, time.monotonic(), 0.0
    while (elapsed := time.monotonic() - started) < seconds:
        per_tick = max(1, round((16 + 14 * math.sin(2 * math.pi * elapsed / seconds)) / 4))
        send_load(stub, per_tick, first=sent)
        sent += per_tick
        if elapsed >= faults:
            send_bad(stub)
            send_refused(stub)
            faults += 10
        time.sleep(max(0.0, 0.25 - (time.monotonic() - started - elapsed)))


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def draw(prometheus: Prometheus, start: float, end: float, out: Path) -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    rows = math.ceil(len(panels) / 2)
    figure, axes = plt.subplots(rows, 2, figsize=(16, 3.2 * rows), sharex=True)
    for axis, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            expr = (
                target["expr"].replace("$__rate_interval", RATE_WINDOW).replace("$pipeline", ".*")
            )
            for series in prometheus.query_range(expr, start, end, 1):
                times = [float(t) - start for t, _ in series["values"]]
                values = [float(v) for _, v in series["values"]]
                axis.plot(times, values, label=legend(target["legendFormat"], series["metric"]))
        axis.set_title(panel["title"], fontsize=10)
        axis.set_ylabel(UNITS.get(panel["fieldConfig"]["defaults"]["unit"], ""), fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6, loc="upper left", ncol=2)
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("seconds into the run", fontsize=8)
    figure.suptitle("Strata (deploy/grafana/dashboards/strata.json), one minute of a real run")
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=72)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as folder,
        running_system(Path(folder), watched) as system,
        running_prometheus(Path(folder), system.settings) as prometheus,
    ):
        stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        prometheus.wait_for("up")  # scraping before the load starts
        start = time.time()
        drive(stub, args.seconds)
        time.sleep(3)  # the last scrapes and rule evaluations
        draw(prometheus, start, time.time(), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
