"""`python -m bench.load`: parse ghz-style flags, send the load, print or write the report.

Exit status: 0 when the run completed (whatever the servers answered), 1 when the target
could not be reached, 2 for a bad command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.load import data, native
from bench.load.options import Options, UsageError, from_args, parser
from bench.load.pool import LoadPool
from bench.load.report import ghz_options, ghz_report
from bench.load.schedule import Plan, split
from bench.load.summary import ProgressBar, summary


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the run started; during it, the run is reported
        print("bench.load: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    try:
        options = from_args(args)
        plan = native.resolve(plan_of(options))
    except (UsageError, ValueError) as exc:
        print(f"bench.load: {exc}", file=sys.stderr)
        return 2
    except ConnectionError as exc:
        print(f"bench.load: {exc}", file=sys.stderr)
        return 1
    bar = ProgressBar(plan.expected, plan.duration)
    try:
        # No more processes than the plan can keep busy (a short run needs one).
        with LoadPool(len(split(plan, options.workers))) as pool:
            results = pool.run(plan, bar.update)
    except ConnectionError as exc:
        bar.finish()
        print(f"bench.load: {exc}", file=sys.stderr)
        return 1
    bar.finish()
    results = results.skip_first(options.skip_first)
    report = ghz_report(results, ghz_options(options, plan, data.describe(options)), options.name)
    for warning in report["strata"]["warnings"]:
        print(f"bench.load: warning: {warning}", file=sys.stderr)
    _emit(render(report, options.format), options.output)
    return 0


def plan_of(options: Options) -> Plan:
    """The run the options describe, with its messages built."""
    return Plan(
        target=options.host,
        method=options.call,
        requests=tuple(data.messages(options)),
        metadata=tuple(options.metadata.items()),
        timeout=options.timeout,
        connect_timeout=options.connect_timeout,
        connections=options.connections,
        rps=options.rps,
        total=options.total,
        duration=options.duration,
        concurrency=options.concurrency,
        tls=options.tls,
        sender=options.sender,
    )


def render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report)
    if fmt == "pretty":
        return json.dumps(report, indent=2)
    return summary(report)


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text + "\n")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text + "\n")
