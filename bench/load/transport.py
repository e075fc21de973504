"""How the load tool reaches its target: plaintext, TLS, or mutual TLS (ghz's `--cacert`,
`--cert`, `--key`, `--cname`).

The certificates are read once, in the parent, and travel to the worker processes as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class Tls:
    root_certificates: bytes | None = None  # None: the system's trust store
    private_key: bytes | None = None  # with certificate_chain: mutual TLS
    certificate_chain: bytes | None = None
    server_name: str = ""  # the name to verify in the server's certificate, if not the host

    @classmethod
    def from_files(
        cls, cacert: Path | None, cert: Path | None, key: Path | None, cname: str = ""
    ) -> Tls:
        return cls(
            root_certificates=cacert.read_bytes() if cacert else None,
            private_key=key.read_bytes() if key else None,
            certificate_chain=cert.read_bytes() if cert else None,
            server_name=cname,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            self.root_certificates, self.private_key, self.certificate_chain
        )

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def aio_channel(target: str, tls: Tls | None, options: list) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.credentials(), options=options + tls.options())


def blocking_channel(target: str, tls: Tls | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, tls.credentials(), options=tls.options())
