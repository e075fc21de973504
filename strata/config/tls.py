"""TLS settings: the certificates of each identity, and whom each internal layer admits.

The credentials built from them, and the check of each caller's identity, are
strata.security.credentials's.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from strata.config.base import Strict
from strata.process.exits import FileUnreadable

GATEWAY = "gateway"  # what the gateway presents to the layers, and tools by default
CERT, KEY, CA = "tls.crt", "tls.key", "ca.crt"  # an identity's files, as in a TLS Secret
INTERNAL = ("preprocess", "inference", "postprocess")


def public_identity(identity: str) -> str:
    """The identity a public (client-facing) server of `identity` presents."""
    return f"{identity}-public"


class TlsSettings(Strict):
    """Certificates by identity; a relative `certs` resolves against the config file's folder."""

    enabled: bool = Field(default=False, description="TLS everywhere; false means plaintext.")
    certs: Path | None = Field(
        default=None,
        description="Folder with a folder per identity (gateway, gateway-public, preprocess, "
        "inference, postprocess), each holding tls.crt, tls.key and ca.crt (`make certs`).",
    )
    allowed_clients: dict[str, list[str]] = Field(
        default_factory=lambda: {name: [GATEWAY] for name in INTERNAL},
        description="The identities each internal layer admits as callers, by the layer's "
        "identity; a layer not listed admits none. Health checks admit any CA-signed caller.",
    )
    client_certificates: bool = Field(
        default=False,
        description="The gateway's public ports (gRPC, REST and admin) require a client "
        "certificate signed by the deployment's CA (gateway-public's ca.crt). Its principal "
        "(its SPIFFE ID, else its first name) is then the client's identity for rate limits, "
        "fair shares, stickiness and statistics, whatever x-client-id says; with API keys "
        "configured, a valid key is required as well and names the client.",
    )
    server_name: str | None = Field(
        default=None,
        description="Name to verify in servers' certificates instead of the dialled host "
        "(e.g. localhost when dialling 127.0.0.1).",
    )
    probe_listen: str | None = Field(
        default=None,
        description="host:port of a plaintext server with only the health service, for "
        "probes that cannot present a certificate (Kubernetes `grpc:` probes). Each process "
        "needs its own port: set it per container (STRATA_TLS__PROBE_LISTEN).",
    )

    @model_validator(mode="after")
    def _complete(self) -> TlsSettings:
        if self.enabled and self.certs is None:
            raise ValueError("tls.enabled needs certs, the folder of identities (make certs)")
        return self

    def resolved(self, base: Path) -> TlsSettings:
        """A copy with a relative `certs` made absolute against `base`."""
        if self.certs is None or self.certs.is_absolute():
            return self
        return self.model_copy(update={"certs": (base / self.certs).resolve()})

    def pem(self, identity: str, name: str) -> bytes:
        """One file (CERT, KEY or CA) of `identity`, with a clear error when it is missing."""
        if self.certs is None:
            raise ValueError("TLS identities need `certs` (tls.enabled requires it)")
        path = self.certs / identity / name
        try:
            return path.read_bytes()
        except OSError as exc:
            raise FileUnreadable(
                f"TLS identity {identity!r}: cannot read {path} ({exc.strerror}); "
                "run `make certs`, or mount the identity's Secret there"
            ) from None
