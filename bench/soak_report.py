"""The soak's report: soak.md (the tables), soak.json (every figure and sample), soak.png."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from bench.mixed_load import Tally, gateway_label
from bench.report import machine
from bench.soak_data import Soak, Verdict

EXAMPLE_CHARACTERS = 160


def write(soak: Soak) -> tuple[str, list[Path]]:
    """soak.md, soak.json and soak.png under the soak's `--out`: (the markdown, the paths)."""
    out = soak.args.out
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "soak.md", out / "soak.json", out / "soak.png"]
    text = markdown(soak)
    paths[0].write_text(text)
    paths[1].write_text(json.dumps(as_json(soak), indent=1) + "\n")
    plot(soak, paths[2])
    return text, paths


def markdown(soak: Soak) -> str:
    lines = [
        "# Soak",
        "",
        *_setup(soak),
        "",
        "## Load, by kind",
        "",
        *_kinds(soak),
        "",
        "## Bad inputs, by case",
        "",
        *_cases(soak.cases),
        "",
        "## Refusals, from the gateway's metrics",
        "",
        *_refusals(soak),
        "",
        "## Processes",
        "",
        *_processes(soak),
        "",
    ]
    verdict = "FAILED: " + "; ".join(soak.failures) if soak.failures else "passed"
    return "\n".join([*lines, f"Soak {verdict}.", ""])


def _setup(soak: Soak) -> list[str]:
    args, loads = soak.args, soak.sampler.load
    shared = (
        f" The machine's 1-minute load average was {sum(loads) / len(loads):.1f} on average, "
        f"{max(loads):.1f} at most (other work on it counts there)."
        if loads
        else ""
    )
    return [
        f"Machine: {machine()}. Config `{args.config}`, {args.minutes:g} min from "
        f"{soak.started} UTC; samples every {args.interval:g} s, growth is the slope after a "
        f"{soak.warmup:.0f} s warm-up.{shared}",
    ]


def _kinds(soak: Soak) -> list[str]:
    lines = [
        "| kind | load | sent | right | failed, by code | refused by the door, by reason "
        "| P50 ms | P99 ms | max ms |",
        "|---|---|---:|---:|---|---|---:|---:|---:|",
    ]
    described = soak.mix.describe()
    for kind, tally in soak.kinds.items():
        s = tally.summary()
        lines.append(
            f"| {kind} | {described[kind]} | {s['sent']:,} | {s['right']:,} | {_codes(tally)} "
            f"| {_refused(soak, kind)} | {_ms(s['p50_ms'])} | {_ms(s['p99_ms'])} "
            f"| {_ms(s['max_ms'])} |"
        )
    lines += [f"\nLoad tool: {warning}." for warning in soak.warnings]
    messages = sum((t.messages for t in soak.kinds.values()), Counter())
    if messages:
        lines += ["", "Commonest failure messages:", ""]
        lines += [f"- {count:,}: {message}" for message, count in messages.most_common(5)]
    return lines


def _refused(soak: Soak, kind: str) -> str:
    """The gateway's refusals of this kind's client, by reason (its metrics' labels)."""
    label = gateway_label(kind)
    reasons: Counter[str] = Counter()
    for (reason, who), n in soak.sampler.counts.refusals.items():
        if who == label:
            reasons[reason] += int(n)
    return ", ".join(f"{r} {n:,}" for r, n in reasons.most_common()) or "none"


def _cases(cases: dict[str, Tally]) -> list[str]:
    lines = [
        "| case | sent | refused as expected | other answers | the refusal, as first seen |",
        "|---|---:|---:|---|---|",
    ]
    for case, tally in cases.items():
        example = (tally.example or "").replace("|", "\\|")[:EXAMPLE_CHARACTERS]
        lines.append(f"| {case} | {tally.sent:,} | {tally.right:,} | {_codes(tally)} | {example} |")
    return lines


def _refusals(soak: Soak) -> list[str]:
    counts = soak.sampler.counts
    if soak.sampler.metrics is None or not soak.sampler.refused:
        return [f"Not read: {soak.sampler.unread or 'no metrics page'}."]
    answers = ", ".join(f"{p} {c} {int(n):,}" for (p, c), n in sorted(counts.answers.items()))
    lines = [f"The gateway's answers, by protocol and code: {answers or 'none'}.", ""]
    if not counts.refused:
        return [*lines, "Refused: none (no door refusal, no rate limit)."]
    lines += ["| reason | client | refused |", "|---|---|---:|"]
    for (reason, who), n in sorted(counts.refusals.items(), key=lambda x: -x[1]):
        lines.append(f"| {reason} | {who} | {int(n):,} |")
    for scope, n in sorted(counts.rate_limited.items()):
        lines.append(f"| rate_limited ({scope}) | | {int(n):,} |")
    by_reason = ", ".join(f"{r} {n:,}" for r, n in counts.by_reason().most_common())
    return [*lines, "", f"By reason: {by_reason}."]


def _processes(soak: Soak) -> list[str]:
    args = soak.args
    lines = [
        f"Bounds: {args.max_growth_mb_per_hour:g} MB/h RSS, {args.max_fd_growth_per_hour:g} "
        f"fds/h, {args.max_thread_growth_per_hour:g} threads/h.",
        "",
        "| process | RSS MB start → end (max) | RSS MB/h | MB/h, second half "
        "| fds start → end (max) | fds/h | threads start → end (max) | threads/h | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [_process_row(v) for v in soak.found]
    if not all(v.judged for v in soak.found):
        lines += [
            "",
            "Under five minutes of samples after the warm-up: growth per hour extrapolates "
            "warm-up and noise, so it is shown but not judged; trust a longer run.",
        ]
    return lines


def _process_row(v: Verdict) -> str:
    ok = "yes" if v.ok else "NO"
    if not v.judged:
        ok = "not judged" if v.ok else "NO"
    rss = "{:.1f} → {:.1f} ({:.1f})".format(*v.rss_mb)
    return (
        f"| {v.process} | {rss} | {v.rss_growth_mb_per_hour:+.1f} "
        f"| {v.rss_growth_second_half:+.1f} | {_triple(v.fds)} | {v.fd_growth_per_hour:+.1f} "
        f"| {_triple(v.threads)} | {v.thread_growth_per_hour:+.1f} | {ok} |"
    )


def _triple(values: tuple[int, int, int]) -> str:
    return "{} → {} ({})".format(*values)


def _codes(tally: Tally) -> str:
    return ", ".join(f"{code} {n:,}" for code, n in tally.failed.most_common()) or "none"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def as_json(soak: Soak) -> dict:
    sampler = soak.sampler
    return {
        "machine": machine(),
        "started": soak.started,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(soak.args).items()},
        "mix": asdict(soak.mix),
        "warmup_seconds": soak.warmup,
        "kinds": {kind: t.summary() for kind, t in soak.kinds.items()},
        "bad_cases": {case: t.summary() for case, t in soak.cases.items()},
        "gateway": sampler.counts.as_dict(),
        "processes": [asdict(v) for v in soak.found],
        "samples": {
            name: {
                "seconds": [round(t, 1) for t in s.seconds],
                "rss_mb": [round(m, 2) for m in s.rss_mb],
                "fds": s.fds,
                "threads": s.threads,
            }
            for name, s in sampler.series.items()
        },
        "refused": [[round(t, 1), n] for t, n in sampler.refused],
        "load_average": [round(x, 2) for x in sampler.load],
        "failures": soak.failures,
    }


def plot(soak: Soak, path: Path) -> None:
    sampler = soak.sampler
    figure, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    rss, fds, threads, refused = axes
    for s in sampler.series.values():
        minutes = [t / 60 for t in s.seconds]
        rss.plot(minutes, s.rss_mb, label=s.name)
        fds.plot(minutes, s.fds, label=s.name)
        threads.plot(minutes, s.threads, label=s.name)
    refused.plot([t / 60 for t, _ in sampler.refused], [n for _, n in sampler.refused])
    for axis in axes:
        axis.axvline(soak.warmup / 60, color="grey", linestyle=":", linewidth=1)
    for axis in (fds, threads, refused):
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    rss.set_ylabel("RSS, MB")
    fds.set_ylabel("open descriptors")
    threads.set_ylabel("threads")
    refused.set_ylabel("gateway refusals\nso far")
    refused.set_xlabel("minutes (dotted: end of warm-up)")
    rss.set_title("Processes during the soak")
    rss.legend(fontsize="small", ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
