"""A throw-away certificate authority and a server certificate, for a local TLS listener.

:func:`make_server_tls` writes, into a directory of the caller's:

* ``ca.pem``: the CA's certificate; clients trust it (librdkafka's ``ssl.ca.location``, a PEM
  truststore for Java clients);
* ``server.pem``: the server's unencrypted PKCS#8 private key followed by its certificate chain,
  as Kafka's ``ssl.keystore.type=PEM`` reads it (``ssl.keystore.location``).

The server certificate names ``localhost`` and the given IP addresses, so clients that verify the
host name (librdkafka's default, ``ssl.endpoint.identification.algorithm=https``) accept it. Both
expire after ``days``. For tests and the local demo only: the CA's key is discarded.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerTls:
    ca_path: Path
    keystore_path: Path


def make_server_tls(directory: Path, hosts: Sequence[str] = ("127.0.0.1",), days: int = 7) -> ServerTls:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kbp local test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "localhost")])
        )
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    keystore_path = directory / "server.pem"
    keystore_path.touch(mode=0o600)
    keystore_path.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
        + ca_cert.public_bytes(pem)
    )
    return ServerTls(ca_path=ca_path, keystore_path=keystore_path)
