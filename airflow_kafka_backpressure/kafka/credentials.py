"""Credentials among a Kafka connection's properties: which properties are secret, references to
secrets that stay on the hosts, and how a value goes into a JAAS configuration.

**Secret properties** (:data:`SECRET_PROPERTIES`): the SASL password and the client key's password.
Wherever the batch's Kafka properties would leave the Airflow worker in the clear — a Spark Connect
plan — they are kept out (``spark/session_secrets.py``).

**References** — Kafka's own config-provider syntax, as a property's whole value:

* ``${dir:/path/to/dir:name}`` — the content of the file ``/path/to/dir/name`` (Kafka's
  ``DirectoryConfigProvider``: the way Kubernetes mounts a secret), taken as it is (a trailing line
  break is part of it, as in Kafka);
* ``${env:NAME}`` — the environment variable ``NAME`` (``EnvVarConfigProvider``).

A reference is resolved where a client is made: by the Python clients here (the planner, the Python
reader on the executors) with :func:`resolved`, and by Spark's Kafka connector itself on the Spark
hosts (Kafka's config providers, which the native reader's options declare). So a secret given by
reference never travels: each host reads its own copy. The referenced file or variable must exist
on every host that makes a client — the Airflow workers and the Spark driver and executors.

**JAAS**: Kafka's Java client takes SASL credentials only as a JAAS configuration string, whose
values are quoted strings parsed by ``java.io.StreamTokenizer``: :func:`jaas_quoted` escapes
``\\``, ``"`` and line breaks so that every password is read as written.

Pure Python: no Airflow, Spark or Kafka imports.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import KafkaConfigError

__all__ = [
    "PROVIDER_CLASSES",
    "SECRET_PROPERTIES",
    "Reference",
    "jaas_quoted",
    "java_key_problem",
    "literal_secrets",
    "reference",
    "resolved",
]

#: The connection properties whose values are credentials.
SECRET_PROPERTIES = frozenset({"sasl.password", "ssl.key.password"})

#: Kafka's config providers a reference may name, by the name it uses: the Java class Spark's
#: Kafka connector loads for it.
PROVIDER_CLASSES = {
    "dir": "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
    "env": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
}

_REFERENCE = re.compile(r"^\$\{(?P<provider>[^}:]*):(?:(?P<path>[^}:]*):)?(?P<key>[^}:]*)\}$")


@dataclass(frozen=True)
class Reference:
    """``${provider:path:key}`` (``path`` None for ``env``)."""

    provider: str
    path: str | None
    key: str

    def __str__(self) -> str:
        return (
            "${" + self.provider + ":" + (f"{self.path}:" if self.path is not None else "") + self.key + "}"
        )


def reference(value: Any, *, name: str = "property", source: str = "Kafka connection") -> Reference | None:
    """The reference ``value`` is (None when it is a plain value). A value in the reference syntax
    that names an unknown provider, or lacks the path ``dir`` needs, raises :class:`KafkaConfigError`
    naming ``name`` and ``source``."""
    if not isinstance(value, str) or not value.startswith("${"):
        return None
    m = _REFERENCE.match(value)
    if m is None:
        return None
    ref = Reference(m["provider"], m["path"], m["key"])
    if ref.provider not in PROVIDER_CLASSES or not ref.key:
        raise KafkaConfigError(
            f"{source}: {name!r} = {value!r} looks like a reference to a secret, but only "
            "${dir:/path/to/dir:file} (a file's content) and ${env:NAME} (an environment variable) are "
            "supported; write the value itself, or one of those"
        )
    if (ref.provider == "dir") != bool(ref.path):
        form = "${dir:/path/to/dir:file}" if ref.provider == "dir" else "${env:NAME}"
        raise KafkaConfigError(f"{source}: {name!r} = {value!r} is not a valid reference; write it as {form}")
    return ref


def _resolve(ref: Reference, name: str, source: str) -> str:
    if ref.provider == "env":
        value = os.environ.get(ref.key)
        if value is None:
            raise KafkaConfigError(
                f"{source}: {name!r} refers to the environment variable {ref.key!r} ({ref}), which is not set "
                f"on this host ({os.uname().nodename}); set it wherever a Kafka client of the pipeline runs "
                "(the Airflow workers and the Spark hosts)"
            )
        return value
    assert ref.path is not None
    path = os.path.join(ref.path, ref.key)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise KafkaConfigError(
            f"{source}: {name!r} refers to the file {path} ({ref}), which cannot be read on this host "
            f"({os.uname().nodename}): {e.strerror or e}. Put the secret there on every host where a Kafka client "
            "of the pipeline runs (the Airflow workers and the Spark hosts), readable by their user"
        ) from e


def resolved(props: Mapping[str, Any], *, source: str = "Kafka connection") -> dict[str, Any]:
    """``props`` with every reference replaced by what it refers to on this host."""
    out = dict(props)
    for key, value in props.items():
        ref = reference(value, name=key, source=source)
        if ref is not None:
            out[key] = _resolve(ref, key, source)
    return out


def literal_secrets(props: Mapping[str, Any]) -> dict[str, str]:
    """The secret properties of ``props`` given as values (not as references)."""
    return {k: str(v) for k, v in props.items() if k in SECRET_PROPERTIES and reference(v) is None}


#: DER of the object identifier of PBES2 (RFC 8018), the scheme of an encrypted PKCS#8 key that
#: OpenSSL and Python's ``cryptography`` write by default.
_PBES2_OID = bytes.fromhex("06092a864886f70d01050d")


def java_key_problem(key_file: Any) -> str | None:
    """Why Kafka's Java client (Spark's connector) cannot use the PEM private key ``key_file``, if this
    host can read it and tell: it decrypts PKCS#8 keys encrypted by the older PBES1 schemes only —
    Java has no "PBES2" SecretKeyFactory (Java 17 to 25 checked), so a PBES2 key fails deep in the
    client with ``Invalid PEM keystore configs``. None when the key is fine or cannot be read here."""
    import base64
    import binascii

    try:
        with open(str(key_file), encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    begin, end = "-----BEGIN ENCRYPTED PRIVATE KEY-----", "-----END ENCRYPTED PRIVATE KEY-----"
    if begin not in text or end not in text:
        return None
    body = text.split(begin, 1)[1].split(end, 1)[0]
    try:
        der = base64.b64decode("".join(body.split()))
    except (binascii.Error, ValueError):
        return None
    if _PBES2_OID not in der[:32]:
        return None
    return (
        f"the private key {key_file} is encrypted with PBES2 (OpenSSL's default), which Kafka's Java client "
        "(Spark's Kafka connector) cannot decrypt. Re-encrypt it with a scheme it reads: "
        f"openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES -in {key_file} -out <new file> (or leave it unencrypted on "
        "hosts that protect it), or read with the Python reader (reader 'python')"
    )


def jaas_quoted(value: str) -> str:
    """``value`` as a quoted JAAS option value that Kafka's parser reads back exactly."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'
