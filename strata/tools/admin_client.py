"""`strata admin`: operate a running system without any other tool.

The gateway's strata.v1.Admin (status, weights, level, reload) and each inference
deployment's repository extension (index, load, unload), reached where the config says
(`services.gateway.admin_listen`, else the gateway's port; `services.inference.<name>`), with
TLS when the config has it and the tokens the config gives (`*_admin_token`, their `*_file`
settings, or STRATA_GATEWAY__ADMIN_TOKEN / STRATA_INFERENCE__ADMIN_TOKEN). Answers print as
tables, or as JSON with --json. Exit status: 0 done; 1 the call was refused or failed; 2 the
command or the config is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from strata.config import ConfigError, Settings, load_settings
from strata.config.base import admin_token_from
from strata.config.endpoints import ServiceEndpoint
from strata.config.gateway import GatewaySettings
from strata.config.inference import InferenceSettings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.rpc.grpc_channels import blocking_channel

PROG = "strata admin"
CONFIG_ENV = "STRATA_CONFIG"
DEFAULT_CONFIG = Path("configs/default.yaml")
TIMEOUT = 30.0
EXIT_FAILED, EXIT_USAGE = 1, 2
ANY_HOST = ("0.0.0.0", "[::]", "::", "")


class UsageError(Exception):
    """The command or the config cannot work; exit status 2."""


@dataclass
class Target:
    """One server to call: its name, its channel, and the token its calls carry."""

    name: str
    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The admin command's options and subcommands."""
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG)),
        help=f"the deployment's config (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG})",
    )
    parser.add_argument("--address", help="the gateway's admin address instead of the config's")
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")
    commands = parser.add_subparsers(dest="action", required=True, metavar="COMMAND")
    commands.add_parser("status", help="level, signals, arms, upstreams, counters")
    weights = commands.add_parser(
        "weights", help="set a pipeline's arm weights live (a later stage's: <pipeline>/<stage>)"
    )
    weights.add_argument("pipeline")
    weights.add_argument("weights", nargs="+", metavar="ARM=WEIGHT")
    level = commands.add_parser("level", help="pin the degradation level, or release it")
    level.add_argument("level", help="0-4, or release")
    commands.add_parser("reload", help="re-read the config file on the gateway")
    index = commands.add_parser("index", help="the models in each inference repository")
    index.add_argument("--ready", action="store_true", help="only versions that serve")
    for action, words in (("load", "load or reload"), ("unload", "unload")):
        command = commands.add_parser(action, help=f"{words} a model on inference deployments")
        command.add_argument("model")
    for command in (index, commands.choices["load"], commands.choices["unload"]):
        command.add_argument(
            "--deployment", action="append", help="only this deployment (repeatable)"
        )


def run(args: argparse.Namespace) -> int:
    """Run one admin command; print its answer; the exit status."""
    try:
        settings = _settings(args.config)
        output = ACTIONS[args.action](settings, args)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as exc:
        print(f"{PROG}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(output.data, indent=2) if args.json else output.text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m strata.tools.admin_client ARGS`, the same as `strata admin ARGS`."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


@dataclass
class Output:
    """An answer as data (for --json) and as text."""

    data: object
    text: str


def _settings(path: Path) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _token(settings: Settings, section: str) -> str:
    """A section's admin token: inline or from the environment, else from its file."""
    config: GatewaySettings | InferenceSettings = getattr(settings, section)
    token = config.admin_token
    if token is None and config.admin_token_file is not None:
        setting = f"{section}.admin_token_file"
        try:
            base = settings.source.parent if settings.source is not None else Path.cwd()
            token = admin_token_from(config.admin_token_file, base, setting)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if token is None:
        variable = f"STRATA_{section.upper()}__ADMIN_TOKEN"
        raise UsageError(
            f"the config sets no {section}.admin_token (nor {section}.admin_token_file, nor "
            f"{variable}): the {section} admin calls are off"
        )
    return token.get_secret_value()


def _dialable(address: str) -> str:
    """A listen address as a client dials it: a wildcard host becomes loopback."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ANY_HOST else address


def _target(settings: Settings, name: str, address: str, section: str) -> Target:
    address = _dialable(address)
    metadata = (("authorization", f"Bearer {_token(settings, section)}"),)
    return Target(name, blocking_channel(address, settings.tls), metadata)


def _gateway(settings: Settings, args: argparse.Namespace) -> admin_pb2_grpc.AdminStub:
    endpoint = settings.services.gateway
    address = args.address or endpoint.admin_listen or endpoint.address
    target = _target(settings, "gateway", address, "gateway")
    stub = admin_pb2_grpc.AdminStub(target.channel)
    return _Authorised(stub, target.metadata)  # type: ignore[return-value]


class _Authorised:
    """A stub whose every call carries the token and the timeout."""

    def __init__(self, stub: object, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub, self._metadata = stub, metadata

    def __getattr__(self, method: str) -> Callable[[Message], Message]:
        call = getattr(self._stub, method)
        return lambda request: call(request, metadata=self._metadata, timeout=TIMEOUT)


def _deployments(settings: Settings, args: argparse.Namespace) -> list[Target]:
    chosen = args.deployment or list(settings.services.inference)
    unknown = sorted(set(chosen) - set(settings.services.inference))
    if unknown:
        known = ", ".join(settings.services.inference)
        raise UsageError(f"no inference deployment {unknown[0]!r} (the config has: {known})")
    return [
        _target(settings, replica, address, "inference")
        for name in chosen
        for replica, address in _replicas(name, settings.services.inference[name])
    ]


def _replicas(name: str, endpoint: ServiceEndpoint) -> list[tuple[str, str]]:
    """Each local replica by name and address (a load must reach every one), or the one
    target the config gives (behind which a balancer picks)."""
    if endpoint.target or endpoint.replicas == 1:
        return [(name, endpoint.address)]
    return [(f"{name}/{i}", listen) for i, listen in enumerate(endpoint.listens)]


def _inference(target: Target) -> v2_grpc.GRPCInferenceServiceStub:
    stub = v2_grpc.GRPCInferenceServiceStub(target.channel)
    return _Authorised(stub, target.metadata)  # type: ignore[return-value]


def _as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


# The commands


def status(settings: Settings, args: argparse.Namespace) -> Output:
    reply = _gateway(settings, args).Status(admin_pb2.StatusRequest())
    return Output(_as_dict(reply), _status_text(reply))


def weights(settings: Settings, args: argparse.Namespace) -> Output:
    wanted = dict(_arm_weight(item) for item in args.weights)
    request = admin_pb2.SetWeightsRequest(pipeline=args.pipeline, weights=wanted)
    reply = _gateway(settings, args).SetWeights(request)
    note = (
        "Set live on this gateway: kept over a reload unless the file's weights for the "
        "pipeline changed; a restart reads the file's."
    )
    pipeline = args.pipeline.partition("/")[0]  # a later stage's arms print with its pipeline's
    arms = _arms_text({pipeline: reply.pipelines[pipeline]})
    return Output(_as_dict(reply), f"{arms}\n{note}")


def level(settings: Settings, args: argparse.Namespace) -> Output:
    if args.level == "release":
        request = admin_pb2.ForceLevelRequest(release=True)
    elif args.level.isdigit():
        request = admin_pb2.ForceLevelRequest(level=int(args.level))
    else:
        raise UsageError(f"level must be 0-4 or release, not {args.level!r}")
    reply = _gateway(settings, args).ForceLevel(request)
    return Output(_as_dict(reply), _level_text(reply))


def reload(settings: Settings, args: argparse.Namespace) -> Output:
    reply = _gateway(settings, args).Reload(admin_pb2.ReloadRequest())
    lines = _listed("applied", reply.applied) + _listed("needs restart", reply.needs_restart)
    lines += _listed("kept live (set by weights; the file's are unchanged)", reply.kept_live)
    return Output(_as_dict(reply), "\n".join(lines) or "nothing changed")


def index(settings: Settings, args: argparse.Namespace) -> Output:
    rows, data = [], {}
    for target in _deployments(settings, args):
        request = v2.RepositoryIndexRequest(ready=args.ready)
        reply = _inference(target).RepositoryIndex(request)
        data[target.name] = _as_dict(reply).get("models", [])
        rows += [[target.name, m.name, m.version, m.state, m.reason] for m in reply.models]
    return Output(data, _table(["deployment", "model", "version", "state", "reason"], rows))


def load(settings: Settings, args: argparse.Namespace) -> Output:
    return _on_each(
        settings,
        args,
        "loaded",
        lambda stub: stub.RepositoryModelLoad(v2.RepositoryModelLoadRequest(model_name=args.model)),
    )


def unload(settings: Settings, args: argparse.Namespace) -> Output:
    return _on_each(
        settings,
        args,
        "unloaded",
        lambda stub: stub.RepositoryModelUnload(
            v2.RepositoryModelUnloadRequest(model_name=args.model)
        ),
    )


def _on_each(
    settings: Settings,
    args: argparse.Namespace,
    done: str,
    call: Callable[[v2_grpc.GRPCInferenceServiceStub], object],
) -> Output:
    """One repository call on each chosen deployment, in turn; the first refusal stops."""
    names = []
    for target in _deployments(settings, args):
        call(_inference(target))
        names.append(target.name)
    text = "\n".join(f"{name}: {args.model} {done}" for name in names)
    return Output({"model": args.model, done: names}, text)


ACTIONS: dict[str, Callable[[Settings, argparse.Namespace], Output]] = {
    "status": status,
    "weights": weights,
    "level": level,
    "reload": reload,
    "index": index,
    "load": load,
    "unload": unload,
}


def _arm_weight(item: str) -> tuple[str, float]:
    arm, sep, weight = item.partition("=")
    try:
        if not sep or not arm:
            raise ValueError
        return arm, float(weight)
    except ValueError:
        raise UsageError(f"weights are ARM=WEIGHT (control=80), not {item!r}") from None


# Text output


def _table(header: list[str], rows: Iterable[list[object]]) -> str:
    cells = [header, *([_cell(value) for value in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _cell(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _listed(label: str, items: Iterable[str]) -> list[str]:
    items = list(items)
    return [f"{label}: {', '.join(items)}"] if items else []


def _level_text(reply: admin_pb2.StatusResponse) -> str:
    forced = " (forced)" if reply.forced else ""
    reason = f": {reply.level_reason}" if reply.level_reason else ""
    return f"level {reply.level} {reply.level_name}{forced}{reason}"


def _arms_text(pipelines: dict[str, admin_pb2.PipelineStatus]) -> str:
    header = [
        "pipeline",
        "arm",
        "deployment",
        "version",
        "weight",
        "config weight",
        "requests",
        "errors",
        "p50 ms",
        "p99 ms",
        "breaker",
    ]
    rows = [
        [
            name,
            a.arm,
            a.deployment,
            a.version,
            a.weight,
            a.config_weight,
            a.requests,
            a.errors,
            a.p50_ms,
            a.p99_ms,
            a.breaker,
        ]
        for name, arms in _all_arms(pipelines)
        for a in arms
    ]
    return _table(header, rows)


def _all_arms(
    pipelines: dict[str, admin_pb2.PipelineStatus],
) -> list[tuple[str, list[admin_pb2.ArmStatus]]]:
    """Each pipeline's arms, then its later stages' as `<pipeline>/<stage>`."""
    arms = []
    for name, pipeline in sorted(pipelines.items()):
        arms.append((name, list(pipeline.arms)))
        arms += [(f"{name}/{stage.stage}", list(stage.arms)) for stage in pipeline.stages]
    return arms


def _status_text(reply: admin_pb2.StatusResponse) -> str:
    upstreams = ", ".join(
        f"{name} {'up' if up else 'DOWN'}" for name, up in sorted(reply.upstreams.items())
    )
    signals = _table(
        ["signal", "value", "threshold", "unit", "pressure"],
        [
            [name, s.value, s.threshold, s.unit, s.pressure]
            for name, s in sorted(reply.signals.items())
        ],
    )
    return "\n\n".join(
        [
            f"{_level_text(reply)}; {reply.inflight} in flight; "
            f"{reply.cache_entries} cached answers",
            f"upstreams: {upstreams}",
            signals,
            _arms_text(dict(reply.pipelines)),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
