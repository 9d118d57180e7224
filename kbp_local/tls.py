"""A throw-away certificate authority and a server certificate, for a local TLS listener.

:func:`make_server_tls` writes, into a directory of the caller's:

* ``ca.pem``: the CA's certificate; clients trust it (librdkafka's ``ssl.ca.location``, a PEM
  truststore for Java clients);
* ``server.pem``: the server's unencrypted PKCS#8 private key followed by its certificate chain,
  as Kafka's ``ssl.keystore.type=PEM`` reads it (``ssl.keystore.location``);
* ``ca-key.pem`` (owner-only): the CA's key, with which :func:`make_client_tls` signs client
  certificates for a listener that asks for them (mutual TLS).

The server certificate names ``localhost`` and the given IP addresses, so clients that verify the
host name (librdkafka's default, ``ssl.endpoint.identification.algorithm=https``) accept it. Both
expire after ``days``. For tests and the local demo only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServerTls:
    ca_path: Path
    keystore_path: Path


@dataclass(frozen=True)
class ClientTls:
    """A client certificate: its PEM file and its private key's (PKCS#8; encrypted with
    ``key_password`` when that is set)."""

    certificate_path: Path
    key_path: Path
    key_password: str | None


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
    _write_private(
        keystore_path,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
        + ca_cert.public_bytes(pem),
    )
    _write_private(
        directory / "ca-key.pem",
        ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return ServerTls(ca_path=ca_path, keystore_path=keystore_path)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_client_tls(
    ca_directory: Path,
    directory: Path,
    name: str,
    *,
    key_password: str | None = None,
    key_encryption: str = "pbes2",
    days: int = 7,
) -> ClientTls:
    """A client certificate for ``name``, signed by the CA that :func:`make_server_tls` made in
    ``ca_directory``: ``<name>.crt.pem`` and ``<name>.key.pem`` (PKCS#8, encrypted with
    ``key_password`` if given) in ``directory``.

    ``key_encryption``: ``"pbes2"`` (PBKDF2 and AES, what OpenSSL writes by default) or ``"pbes1"``
    (SHA-1 and triple DES: ``openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES``, the scheme Kafka's Java client
    can decrypt, made by the ``openssl`` program)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((ca_directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_directory / "ca-key.pem").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(key_password.encode())
        if key_password
        else serialization.NoEncryption()
    )
    certificate_path, key_path = directory / f"{name}.crt.pem", directory / f"{name}.key.pem"
    certificate_path.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    if key_password and key_encryption == "pbes1":
        plain = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        _write_private(key_path, _openssl_pbes1(plain, key_password))
    elif key_encryption in ("pbes1", "pbes2"):
        _write_private(key_path, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, encryption))
    else:
        raise ValueError(f"key_encryption must be 'pbes1' or 'pbes2', got {key_encryption!r}")
    return ClientTls(certificate_path, key_path, key_password or None)


def _openssl_pbes1(plain_pem: bytes, password: str) -> bytes:
    """``plain_pem`` (an unencrypted PKCS#8 key) encrypted by ``openssl pkcs8 -v1 PBE-SHA1-3DES``;
    the password goes through a pipe, never on the command line."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "key.pem"
        _write_private(source, plain_pem)
        read, write = os.pipe()
        os.write(write, password.encode() + b"\n")
        os.close(write)
        try:
            done = subprocess.run(
                [
                    "openssl",
                    "pkcs8",
                    "-topk8",
                    "-v1",
                    "PBE-SHA1-3DES",
                    "-in",
                    str(source),
                    "-passout",
                    f"fd:{read}",
                ],
                pass_fds=(read,),
                capture_output=True,
                check=False,
            )
        finally:
            os.close(read)
    if done.returncode != 0:
        raise RuntimeError(f"openssl pkcs8 failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout
