"""A development CA and a certificate per identity, for mutual TLS between layers (`make certs`).

Writes a folder per identity into the output folder, each holding `tls.crt`, `tls.key` and
`ca.crt` (the layout strata.security.credentials reads and a Kubernetes TLS Secret mounts), and a
`kustomization.yaml` making one Secret per identity, `strata-tls-NAME`
(`kubectl apply -k build/certs -n strata-dev`). Identities: `gateway` (what the gateway presents
to the layers), `gateway-public` (its client-facing port), `preprocess`, `inference` (both
deployments) and `postprocess`. Each certificate carries its SPIFFE ID (spiffe://strata/NAME,
what servers admit callers by) and the names its layer is dialled by: compose service names,
Kubernetes Service names in each namespace, localhost and 127.0.0.1.
It also writes the gateway's development secrets, never committed: an admin token
(`strata-admin/token`), an API key for a client `dev` (its hash in
`strata-api-keys/api-keys.yaml`, the key itself in `client/api-key`, for the client alone), and
Secrets `strata-admin` and `strata-api-keys` of them in the same kustomization. Every private
key, token and API key is written 0600: readable by the user who ran this alone (compose runs
the containers as that user).
For development only: production certificates come from your own CA (e.g. cert-manager), and
production secrets from your secrets manager.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from strata.config.tls import CA, CERT, GATEWAY, KEY, public_identity
from strata.security.credentials import key_hash, spiffe_id

SERVER, CLIENT = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
# Identity: (the hosts it is dialled by, its uses). A layer is a client too when its container
# checks its own health with its own certificate.
IDENTITIES = {
    GATEWAY: ((), (CLIENT,)),
    public_identity(GATEWAY): ((GATEWAY,), (SERVER,)),
    "preprocess": (("preprocess",), (SERVER, CLIENT)),
    "inference": (("inference-a", "inference-b"), (SERVER, CLIENT)),
    "postprocess": (("postprocess",), (SERVER, CLIENT)),
}
NAMESPACES = ("strata", "strata-dev")  # the overlays'
DAYS = 365
# The gateway's secrets (Secret name: its file), mounted beside the identities' folders.
ADMIN_SECRET, ADMIN_FILE = "strata-admin", "token"
KEYS_SECRET, KEYS_FILE = "strata-api-keys", "api-keys.yaml"
CLIENT_FOLDER = "client"  # the development client's key, and any client certificates
CLIENT, CLIENT_KEY = "dev", f"{CLIENT_FOLDER}/api-key"  # the development client, its key


def secret_name(identity: str) -> str:
    """The Kubernetes Secret holding `identity`'s certificate."""
    return f"strata-tls-{identity}"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: str, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
    )


def _names(identity: str, hosts: tuple[str, ...], namespaces: tuple[str, ...]) -> list:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe_id(identity))]
    if hosts:
        dns = [*hosts, *(f"{h}.{ns}.svc.cluster.local" for h in hosts for ns in namespaces)]
        names += [x509.DNSName(h) for h in [*dns, "localhost"]]
        names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    return names


def _write_identity(
    folder: Path, ca: x509.Certificate, ca_key, identity: str, names: list, uses: tuple
) -> None:
    key = _key()
    cert = (
        _builder(identity, ca.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(list(uses)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    out = folder / identity
    out.mkdir(parents=True, exist_ok=True)
    (out / CA).write_bytes(_pem(ca))
    (out / CERT).write_bytes(_pem(cert))
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private(out / KEY, private)


def write_private(path: Path, content: bytes) -> None:
    """Write `content` readable and writable by its owner alone (0600), from the start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)


def _write_secrets(folder: Path) -> None:
    """A new admin token, and a new API key for the development client."""
    write_private(folder / ADMIN_SECRET / ADMIN_FILE, secrets.token_hex(32).encode())
    key = secrets.token_urlsafe(32)
    keys = [{"client_id": CLIENT, "sha256": key_hash(key)}]
    write_private(folder / KEYS_SECRET / KEYS_FILE, yaml.safe_dump(keys).encode())
    write_private(folder / CLIENT_KEY, key.encode())


def _kustomization() -> str:
    generators = [
        {
            "name": secret_name(identity),
            "type": "kubernetes.io/tls",
            "files": [f"{name}={identity}/{name}" for name in (CERT, KEY, CA)],
        }
        for identity in IDENTITIES
    ]
    generators += [
        {"name": name, "type": "Opaque", "files": [f"{file}={name}/{file}"]}
        for name, file in ((ADMIN_SECRET, ADMIN_FILE), (KEYS_SECRET, KEYS_FILE))
    ]
    spec = {"secretGenerator": generators, "generatorOptions": {"disableNameSuffixHash": True}}
    return yaml.safe_dump(spec, sort_keys=False)


def make_certs(
    folder: Path, namespaces: tuple[str, ...] = NAMESPACES, clients: tuple[str, ...] = ()
) -> None:
    """A new CA, every identity's certificate and the gateway's secrets under `folder`,
    replacing what was there; with `clients`, a client certificate for each (`--client`),
    under client/NAME, for a gateway whose public ports require one (tls.client_certificates)."""
    ca_key = _key()
    ca = (
        _builder("Strata development CA", _name("Strata development CA"), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    for identity, (hosts, uses) in IDENTITIES.items():
        names = _names(identity, hosts, namespaces)
        _write_identity(folder, ca, ca_key, identity, names, uses)
    for client in clients:
        names = _names(client, (), ())
        uses = (ExtendedKeyUsageOID.CLIENT_AUTH,)  # CLIENT is the development client's name
        _write_identity(folder / CLIENT_FOLDER, ca, ca_key, client, names, uses)
    _write_secrets(folder)
    (folder / "kustomization.yaml").write_text(_kustomization())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/certs"), help="output folder")
    parser.add_argument(
        "--namespace",
        action="append",
        help=f"Kubernetes namespace to name Services in (repeatable; default {NAMESPACES})",
    )
    parser.add_argument(
        "--client",
        action="append",
        default=[],
        help="a client to write a certificate for, under client/NAME (repeatable)",
    )
    args = parser.parse_args()
    make_certs(args.out, tuple(args.namespace or NAMESPACES), tuple(args.client))


if __name__ == "__main__":
    main()
