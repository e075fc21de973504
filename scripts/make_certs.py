"""A development CA and certificates for TLS on every hop (`make certs`).

Writes into the output folder: `ca.pem` (the deployment's CA), `server.pem`/`server-key.pem`
(the identity every internal service presents, and the gateway's public one),
`client.pem`/`client-key.pem` (the identity the gateway presents to internal services under
mutual TLS). The certificates name every host the layers are reached by locally, in compose
and in Kubernetes. For development only: production certificates come from your own CA.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOSTS = [
    "localhost", "gateway", "preprocess", "inference-a", "inference-b", "postprocess",
    "*.strata.svc.cluster.local", "*.strata-dev.svc.cluster.local",
]  # fmt: skip
DAYS = 365


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(folder: Path, stem: str, cert: x509.Certificate, key) -> None:
    (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path = folder / f"{stem}-key.pem"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)


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


def make_certs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = (
        _builder("Strata development CA", _name("Strata development CA"), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(folder, "ca", ca, None)
    sans = [x509.DNSName(h) for h in HOSTS] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for stem, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = _key()
        cert = (
            _builder(f"strata-{stem}", ca.subject, key.public_key())
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        _write(folder, stem, cert, key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/certs"), help="output folder")
    make_certs(parser.parse_args().out)


if __name__ == "__main__":
    main()
