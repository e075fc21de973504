"""Where each Strata process spends its CPU: `python -m bench.profile [--workload images]
[--seconds 10] [--in-flight 16]` (`make profile`).

The system of a workload of bench.peers.images (images: a JPEG a request through decode,
resize, crop, normalise and the stand-in CNN; text: a sentence a request through the
tokenizer and MiniLM) runs under a closed loop of `--in-flight` requests on one connection,
while py-spy samples every one of its processes (the gateway, each preprocess replica, each
inference deployment, postprocess) for `--seconds` at `--rate` Hz, without pausing them
(`--nonblocking`; idle threads are not sampled), or with `--native` C frames too, pausing
each process a moment per sample (gRPC's core and uvloop have no Python frames: without it
their time shows as the loop's). Each sample's stack is put, from its innermost frame
outward, in the first of these it meets (bench/profile_stacks.py):

- the work: ONNX Runtime, Pillow, tokenizers, the preprocess steps and postprocess rules;
- (de)serialising: protobuf and Strata's codec;
- gRPC: grpc's Python, its aio calls and (`--native`) its core;
- the loop: asyncio's and uvloop's frames with nothing of the above below them;
- Strata: its own modules (strata/, services/);
- other: the rest (telemetry, the standard library on its own, threads started in C).

It prints and writes (`--out`, bench/results/profile_<workload>.md) each process's samples,
the share of each category, and the commonest innermost frames of `other`. py-spy must be
allowed to read other processes' memory (root, or
CAP_SYS_PTRACE; ptrace_scope 0 or 1 for a child of one's own).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.image_chain import photo_size
from bench.load import LoadPool, Plan
from bench.measure import closed
from bench.peers import cpu
from bench.peers.images import WORKLOADS
from bench.peers.per_process import front_to_back
from bench.peers.run import CLIENT, RESULTS
from bench.profile_stacks import Profile, table
from strata.tools.launch import ROOT

WARM_SECONDS = 2.0
SPY_GRACE_SECONDS = 30.0  # py-spy's start and its writing the file, beyond the sampling


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(prefix="strata-profile-") as tmp:
        folder = Path(tmp)
        work = WORKLOADS[args.workload](args, folder)
        with work.strata(folder / "strata") as target, LoadPool(1) as pool:
            plan = Plan(
                target=target.address,
                method=target.method,
                requests=work.requests,
                metadata=CLIENT,
                timeout=30,
                connections=1,
            )
            closed(pool, plan, args.in_flight, WARM_SECONDS)
            # The loop runs past the sampling on both sides: every sample sees it.
            load = threading.Thread(
                target=closed, args=(pool, plan, args.in_flight, seconds + 2 * WARM_SECONDS)
            )
            load.start()
            try:
                processes = cpu.processes(target.roots())
                samples = record(spy, processes, (seconds, args.rate, args.native), folder)
            finally:
                load.join()
        if args.stacks:
            keep_stacks(folder, args.out / f"stacks_{args.workload}")
    heading = (
        f"# Where each process's CPU goes: {work.heading}, {args.in_flight} in flight\n\n"
        f"py-spy, {seconds:g} s at {args.rate} Hz a process, "
        + ("with native frames" if args.native else "Python frames only, not pausing it")
        + "; a share is of that process's busy samples (idle threads left out).\n\n"
    )
    text = heading + "\n".join(table(samples)) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile_{args.workload}.md").write_text(text)
    return 0


def keep_stacks(folder: Path, into: Path) -> None:
    """Each process's raw py-spy stacks (one `frame;frame;... count` line a stack), kept for
    a flame graph or a closer look than the categories give."""
    into.mkdir(parents=True, exist_ok=True)
    for raw in folder.glob("*.txt"):
        shutil.copy(raw, into / raw.name)


def record(
    spy: str, processes: dict[str, int], sampling: tuple[float, int, bool], folder: Path
) -> dict[str, Profile]:
    """py-spy on every process at once (`sampling`: seconds, rate, native frames or not):
    each one's samples by category."""
    seconds, rate, native = sampling
    spies = {}
    with contextlib.ExitStack() as stack:
        for name in front_to_back(list(processes)):
            raw = folder / f"{name.replace('/', '-')}.txt"
            command = [spy, "record", "--native" if native else "--nonblocking"]
            command += ["--pid", str(processes[name]), "--duration", f"{seconds:g}"]
            command += ["--rate", str(rate), "--format", "raw", "--output"]
            log = stack.enter_context((folder / f"{raw.stem}.log").open("wb"))
            process = subprocess.Popen([*command, str(raw)], stdout=log, stderr=log, cwd=ROOT)
            spies[name] = (process, raw)
        for process, _ in spies.values():
            process.wait(timeout=seconds + SPY_GRACE_SECONDS)
    missing = [name for name, (_, raw) in spies.items() if not raw.exists()]
    if missing:
        logs = [(folder / f"{name.replace('/', '-')}.log").read_text()[-300:] for name in missing]
        raise SystemExit(f"py-spy recorded nothing for {', '.join(missing)}: {logs}")
    return {name: Profile.of(raw.read_text()) for name, (_, raw) in spies.items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument(
        "--text-config",
        type=Path,
        default=ROOT / "configs" / "text.yaml",
        help="the system whose embed pipeline the text workload profiles",
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="images")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds py-spy samples")
    parser.add_argument("--rate", type=int, default=100, help="samples a second, a process")
    parser.add_argument("--in-flight", type=int, default=16, help="the closed loop's requests")
    parser.add_argument(
        "--native",
        action="store_true",
        help="C frames too (gRPC's core, uvloop, ONNX Runtime), pausing each process a moment "
        "per sample",
    )
    parser.add_argument("--photo-size", type=photo_size, default=(640, 480), help="WIDTHxHEIGHT")
    parser.add_argument(
        "--objective-ms",
        type=float,
        default=10_000.0,
        help="the images pipeline's latency objective: long, so the ladder sheds nothing",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 s of samples")
    parser.add_argument(
        "--stacks",
        action="store_true",
        help="keep each process's raw stacks in OUT/stacks_WORKLOAD/ (py-spy's raw format)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
