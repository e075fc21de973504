"""The load tool's command line, in ghz's words: `--call`, `-d`, `-c`, `-n`, `-z`, `--rps` ...

Flags keep ghz's names and meanings where Strata's tool does the same thing, so a ghz command
line runs unchanged. One difference: plaintext is the default (ghz's `--insecure`, accepted),
and TLS is on when `--cacert` (or `--cert`/`--key` for mutual TLS) is given. A target given as
a URL, `http://host:port/v2/models/NAME/infer`, is driven over the v2 REST API instead (HTTP/1.1
POSTs of JSON bodies, plaintext), and needs no `--call`.
Durations are Go-style (`500ms`, `10s`, `1m30s`); a bare number is seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.load import rest
from bench.load.transport import Tls

FORMATS = ("summary", "json", "pretty")
SENDERS = ("auto", "python", "compiled")  # bench/load/native.py
DEFAULT_TOTAL = 200  # ghz's default -n
DEFAULT_CONCURRENCY = 50  # ghz's default -c (closed loop)
EXAMPLE_CALL = "inference.GRPCInferenceService.ModelInfer"
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class UsageError(ValueError):
    """A flag is missing, malformed or contradicts another; the message says which."""


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (`1m30s`, `250ms`) or a bare number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise UsageError(f"bad duration {text!r}: use e.g. 500ms, 10s, 1m30s")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def method_path(call: str) -> str:
    """`package.Service.Method` or `package.Service/Method` as a gRPC path `/pkg.Svc/Method`."""
    call = call.strip().lstrip("/")
    service, sep, method = call.rpartition("/")
    if not sep:
        service, _, method = call.rpartition(".")
    if not service or not method:
        raise UsageError(f"--call {call!r}: give package.Service.Method, e.g. {EXAMPLE_CALL}")
    return f"/{service}/{method}"


@dataclass
class Options:
    """One load run, as the command line describes it."""

    host: str  # gRPC: host:port; HTTP: the URL's origin, http://host:port
    call: str  # gRPC: the path, /package.Service/Method; HTTP: the URL's /v2/models/NAME/infer
    data: str | None = None
    data_file: Path | None = None
    binary_file: Path | None = None
    dataset: str | None = None
    model: str | None = None
    batch: int = 1
    concurrency: int | None = None
    total: int | None = None
    duration: float | None = None
    rps: float | None = None
    connections: int = 1
    timeout: float = 20.0
    connect_timeout: float = 10.0
    metadata: dict[str, str] = field(default_factory=dict)
    format: str = "summary"
    output: Path | None = None
    workers: int = 1
    name: str = ""
    tls: Tls | None = None
    skip_first: int = 0
    sender: str = "auto"

    @property
    def open_loop(self) -> bool:
        return self.rps is not None

    @property
    def http(self) -> bool:
        return rest.is_url(self.host)


def default_workers() -> int:
    """One worker process per two cores, at most four: enough to outpace this machine."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.load",
        description="Drive a KServe v2 endpoint (gRPC, or REST) with load, ghz-style.",
    )
    p.add_argument(
        "host",
        help="server address, host:port (gRPC), or a v2 REST endpoint's URL, "
        "http://host:port/v2/models/NAME/infer",
    )
    p.add_argument(
        "--call",
        help="gRPC method, e.g. inference.GRPCInferenceService.ModelInfer (not for a URL)",
    )
    p.add_argument("-d", "--data", help="request message as JSON (a list: sent in turn)")
    p.add_argument(
        "-D",
        "--data-file",
        type=Path,
        help="request data: JSON message(s), or .npz arrays by input name",
    )
    p.add_argument("-B", "--binary-file", type=Path, help="a serialized request message")
    p.add_argument("--dataset", help="draw inputs from a demo data set: digits, tabular")
    p.add_argument("--model", help="model (pipeline) for --dataset or .npz data")
    p.add_argument("--batch", type=int, default=1, help="rows per request from a data set")
    p.add_argument(
        "-c",
        "--concurrency",
        type=int,
        help="closed loop: requests in flight (default 50); "
        "with --rps: the most in flight (default no limit)",
    )
    p.add_argument("-n", "--total", type=int, help="requests to send (default 200)")
    p.add_argument("-z", "--duration", help="run this long (overrides -n), e.g. 30s")
    p.add_argument(
        "-r",
        "--rps",
        type=float,
        help="open loop: this many requests per second, latency from when due",
    )
    p.add_argument(
        "--connections",
        type=int,
        help="connections, at least one per worker (default: gRPC 1; HTTP, one request at a "
        "time on each, as many as -c)",
    )
    p.add_argument("-t", "--timeout", default="20s", help="per-request deadline (default 20s)")
    p.add_argument("--connect-timeout", default="10s", help="connection deadline (default 10s)")
    p.add_argument(
        "-m",
        "--metadata",
        help='request metadata as a JSON object, e.g. \'{"x-client-id": "bench"}\'',
    )
    p.add_argument("--insecure", action="store_true", help="plaintext (the default)")
    p.add_argument("--cacert", type=Path, help="TLS: the CA that signed the server's certificate")
    p.add_argument("--cert", type=Path, help="mutual TLS: this client's certificate (PEM)")
    p.add_argument("--key", type=Path, help="mutual TLS: this client's private key (PEM)")
    p.add_argument("--cname", default="", help="TLS: the server name its certificate carries")
    p.add_argument(
        "--skipFirst",
        dest="skip_first",
        type=int,
        default=0,
        help="leave the first N answers out of the report (warm-up)",
    )
    p.add_argument("-O", "--format", default="summary", choices=FORMATS, help="report format")
    p.add_argument("-o", "--output", type=Path, help="write the report here, not stdout")
    p.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="sending processes, each its own event loop and channels",
    )
    p.add_argument("--name", default="", help="a name for the run, kept in the report")
    p.add_argument(
        "--sender",
        default="auto",
        choices=SENDERS,
        help="who sends gRPC calls: compiled (build/load-sender, `make load-sender`; a fraction "
        "of Python's CPU per call), python, or auto (default): compiled where built",
    )
    return p


def from_args(args: argparse.Namespace) -> Options:
    """Validated options from parsed arguments."""
    sources = [s for s in (args.data, args.data_file, args.binary_file, args.dataset) if s]
    if len(sources) != 1:
        raise UsageError(
            "give exactly one of -d/--data, -D/--data-file, -B/--binary-file or --dataset"
        )
    host, call = _target(args.host, args.call)
    options = Options(
        host=host,
        call=call,
        data=args.data,
        data_file=args.data_file,
        binary_file=args.binary_file,
        dataset=args.dataset,
        model=args.model,
        batch=args.batch,
        concurrency=args.concurrency,
        total=args.total,
        duration=parse_duration(args.duration) if args.duration else None,
        rps=args.rps,
        connections=args.connections or _connections(host, args.concurrency),
        timeout=parse_duration(args.timeout),
        connect_timeout=parse_duration(args.connect_timeout),
        metadata=_metadata(args.metadata),
        format=args.format,
        output=args.output,
        workers=args.workers,
        name=args.name,
        tls=_tls(args),
        skip_first=args.skip_first,
        sender=args.sender,
    )
    check(options)
    return options


def _target(host: str, call: str | None) -> tuple[str, str]:
    """(host, call): host:port and a gRPC path, or a URL's origin and its v2 infer path."""
    if not rest.is_url(host):
        if not call:
            raise UsageError(f"--call names the gRPC method, e.g. {EXAMPLE_CALL}")
        return host, method_path(call)
    if call:
        raise UsageError(f"--call is for gRPC; the URL {host} names its endpoint itself")
    try:
        return rest.split_url(host)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _connections(host: str, concurrency: int | None) -> int:
    """HTTP/1.1 carries one request at a time on a connection: one for each in flight."""
    return (concurrency or DEFAULT_CONCURRENCY) if rest.is_url(host) else 1


def _tls(args: argparse.Namespace) -> Tls | None:
    """TLS from --cacert/--cert/--key/--cname; None for plaintext."""
    if not (args.cacert or args.cert or args.key):
        if args.cname:
            raise UsageError("--cname needs TLS: give --cacert (and --cert/--key for mutual TLS)")
        return None
    if args.insecure:
        raise UsageError("--insecure (plaintext) contradicts --cacert/--cert/--key (TLS)")
    if bool(args.cert) != bool(args.key):
        raise UsageError("mutual TLS needs both --cert and --key")
    for flag, path in (("--cacert", args.cacert), ("--cert", args.cert), ("--key", args.key)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag} {path}: no such file")
    return Tls.from_files(args.cacert, args.cert, args.key, args.cname)


def check(options: Options) -> None:
    """Refuse values that cannot describe a run."""
    positive = {
        "-c/--concurrency": options.concurrency,
        "-n/--total": options.total,
        "--rps": options.rps,
        "--connections": options.connections,
        "--workers": options.workers,
        "--batch": options.batch,
    }
    for flag, value in positive.items():
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    if options.skip_first < 0:
        raise UsageError(f"--skipFirst must be zero or more, got {options.skip_first}")
    for flag, seconds in (("-z/--duration", options.duration), ("-t/--timeout", options.timeout)):
        if seconds is not None and seconds <= 0:
            raise UsageError(f"{flag} must be positive")
    if options.http and options.tls is not None:
        raise UsageError("TLS flags are for gRPC; the HTTP mode drives plaintext http:// URLs")
    if not options.http and ":" not in options.host:
        raise UsageError(f"host {options.host!r} must be host:port")


def _metadata(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"-m/--metadata is not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise UsageError('-m/--metadata must be a JSON object of strings: {"key": "value"}')
    return {str(k).lower(): v for k, v in value.items()}
