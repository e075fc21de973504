"""A health check over the gRPC health protocol: `python -m strata.tools.healthcheck ADDRESS`.

Asks `grpc.health.v1.Health/Check` at ADDRESS (for the whole server, or one `--service`) and
exits 0 only when the answer is SERVING. NOT_SERVING, an unknown service, no answer within
`--timeout` or any other error exits 1, with the reason on stderr. With `--config`, it speaks
the config's TLS, presenting the certificate of `--identity` (inside a container, its layer's
own: every layer admits any CA-signed caller to its health service). Container health checks
(the compose file's) run it; Kubernetes asks the same RPC with its native `grpc:` probes, on
the plaintext port `tls.probe_listen` opens, as they cannot present a certificate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import strata.process.pydantic_plugins  # noqa: F401  (first: before any pydantic model is built)
from strata.config import load_settings
from strata.config.tls import GATEWAY, TlsSettings
from strata.rpc.grpc_channels import blocking_channel


def check(
    address: str,
    service: str = "",
    timeout: float = 2.0,
    tls: TlsSettings | None = None,
    identity: str = GATEWAY,
) -> str:
    """The status name (e.g. SERVING) the server at `address` reports for `service`.

    Raises grpc.RpcError when the server cannot be reached in time or does not know `service`.
    """
    with blocking_channel(address, tls or TlsSettings(), identity) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        # The health stubs declare HealthStub without its methods (sync and aio differ).
        reply = stub.Check(request, timeout=timeout)  # type: ignore[attr-defined]
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata.tools.healthcheck", description=__doc__)
    parser.add_argument("address", help="host:port of the gRPC server, e.g. 127.0.0.1:8001")
    parser.add_argument("--service", default="", help="service name to ask about (default: all)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for an answer")
    parser.add_argument("--config", type=Path, help="deployment config, for its TLS settings")
    parser.add_argument(
        "--identity", default=GATEWAY, help="certificate to present under TLS (default: gateway)"
    )
    args = parser.parse_args(argv)
    tls = load_settings(args.config).tls if args.config else None
    try:
        status = check(args.address, args.service, args.timeout, tls, args.identity)
    except grpc.RpcError as exc:
        print(f"{args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except OSError as exc:  # a certificate the config names is missing
        print(f"{args.address}: {exc}", file=sys.stderr)
        return 1
    if status != "SERVING":
        print(f"{args.address}: {status}", file=sys.stderr)
        return 1
    print(f"{args.address}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
