"""TLS on every hop and API keys at the gateway.

With `tls.enabled`, internal services (preprocess, inference, postprocess) accept only callers
presenting a certificate signed by the deployment's CA (mutual TLS); the gateway's public port
serves its certificate without asking clients for one (clients authenticate with API keys).
Plaintext only when the config says so, for local development.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from pathlib import Path

import grpc
from pydantic import Field, model_validator

from strata.strict import Strict


class TlsSettings(Strict):
    """Certificates; relative paths resolve against the config file's folder."""

    enabled: bool = Field(default=False, description="TLS everywhere; false means plaintext.")
    ca: Path | None = Field(default=None, description="CA certificate that signs every peer.")
    cert: Path | None = Field(default=None, description="Server certificate (PEM).")
    key: Path | None = Field(default=None, description="Server private key (PEM).")
    client_cert: Path | None = Field(
        default=None, description="Certificate callers present to internal services."
    )
    client_key: Path | None = Field(default=None, description="Private key of client_cert.")
    server_name: str | None = Field(
        default=None,
        description="Name to verify in servers' certificates instead of the dialled host "
        "(e.g. localhost when dialling 127.0.0.1).",
    )

    @model_validator(mode="after")
    def _complete(self) -> TlsSettings:
        if self.enabled:
            missing = [
                k
                for k in ("ca", "cert", "key", "client_cert", "client_key")
                if not getattr(self, k)
            ]
            if missing:
                raise ValueError(f"tls.enabled needs {', '.join(missing)}")
        return self

    def resolved(self, base: Path) -> TlsSettings:
        """A copy with relative paths made absolute against `base`."""
        paths = {
            k: (base / v).resolve()
            for k in ("ca", "cert", "key", "client_cert", "client_key")
            if (v := getattr(self, k)) is not None and not v.is_absolute()
        }
        return self.model_copy(update=paths)


def server_credentials(tls: TlsSettings, public: bool) -> grpc.ServerCredentials | None:
    """None for plaintext; mutual TLS for internal servers; server-only TLS for public ones."""
    if not tls.enabled:
        return None
    return grpc.ssl_server_credentials(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=tls.ca.read_bytes(),
        require_client_auth=not public,
    )


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials | None:
    """None for plaintext; otherwise verify servers by the CA and present the client cert."""
    if not tls.enabled:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.client_key.read_bytes(),
        certificate_chain=tls.client_cert.read_bytes(),
    )


def channel_options(tls: TlsSettings) -> list[tuple[str, str]]:
    if tls.enabled and tls.server_name:
        return [("grpc.ssl_target_name_override", tls.server_name)]
    return []


class ApiKey(Strict):
    """A client's API key, stored only as its SHA-256."""

    client_id: str = Field(min_length=1, description="Who the key belongs to.")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="Hex SHA-256 of the key (`python -m strata.security`).",
    )


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Looks an API key up by its hash; the key itself is never kept or logged."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self._by_hash = {k.sha256: k.client_id for k in keys}

    def __bool__(self) -> bool:
        return bool(self._by_hash)

    def client(self, key: str | None) -> str | None:
        """The client id of `key`, or None when it is missing or unknown."""
        return self._by_hash.get(key_hash(key)) if key else None


def main() -> None:
    """Print a new API key for CLIENT_ID and the config line that admits it."""
    client = sys.argv[1] if len(sys.argv) > 1 else "client"
    key = secrets.token_urlsafe(32)
    print(f"key (give to the client, never store): {key}")
    print(f"config:  - {{client_id: {client}, sha256: {key_hash(key)}}}")


if __name__ == "__main__":
    main()
