"""CPU milliseconds per answered request, by process: where each server's time goes.

Every benchmark that sets Strata beside its peers prints the same table: one row per
process of each server (Strata's gateway, each preprocess replica, each inference
deployment, postprocess; MLServer's parent and each of its workers; KServe's transformer and
predictor), a column per concurrency, and a row of each server's processes together. The
in-process loop, a process with no server, stands beside them as its one figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# server title -> requests in flight -> process name -> CPU ms per answered request
Measured = Mapping[str, Mapping[int, Mapping[str, float]]]
# Strata's layers in the order a request meets them; other servers keep their own order.
LAYERS = ("gateway", "preprocess", "inference", "postprocess")


def front_to_back(names: Sequence[str]) -> list[str]:
    """Strata's processes in the order a request meets them (others as they came)."""

    def layer(name: str) -> int:
        return next((i for i, p in enumerate(LAYERS) if name.startswith(p)), len(LAYERS))

    return sorted(names, key=layer)  # stable: replicas keep their order


def cpu_table(measured: Measured, loops: Mapping[str, float] | None = None) -> list[str]:
    """The Markdown table: each server's processes and their sum at each concurrency, then
    each in-process loop's CPU ms per request (`loops`: its title -> ms)."""
    concurrencies = sorted({c for by_c in measured.values() for c in by_c}) or [1]
    lines = [
        "| server | process | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
        "|---|---|" + "---:|" * len(concurrencies),
    ]
    for title, by_c in measured.items():
        seen = {name: None for ms in by_c.values() for name in ms}
        for name in front_to_back(list(seen)):
            lines.append(_row(title, name, [by_c.get(c, {}).get(name) for c in concurrencies]))
        totals = [sum(by_c[c].values()) if c in by_c else None for c in concurrencies]
        lines.append(_row(title, "**all**", totals))
    for title, ms in (loops or {}).items():
        lines.append(_row(title, "the loop", [ms] + [None] * (len(concurrencies) - 1)))
    return lines


def _row(title: str, process: str, cells: Sequence[float | None]) -> str:
    shown = " | ".join("-" if ms is None else f"{ms:.2f}" for ms in cells)
    return f"| {title} | {process} | {shown} |"
