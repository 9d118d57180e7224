"""The decoders' :class:`~.base.SchemaSource` over confluent-kafka's ``SchemaRegistryClient`` (a
maintained client of Confluent's REST API; :class:`~..hooks.schema_registry.SchemaRegistryHook`
builds it from a ``schema_registry`` connection).

The client caches what never changes (a schema by id, a subject's numbered version) for its life;
``latest`` is asked each time. Its errors become :class:`~.base.DecoderError` naming the
connection (``where``), the subject, version or id, and what to do — never the URL's credentials
or the password, which the client holds and no message repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .base import DecoderError, RegisteredSchema

T = TypeVar("T")

# Confluent's error codes (https://docs.confluent.io/platform/current/schema-registry/develop/api.html#errors)
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
UNAUTHORIZED = (401, 40101)


class ConfluentSchemas:
    """Schemas of one registry, read through ``client`` (a confluent-kafka ``SchemaRegistryClient``);
    ``where`` names it in messages (``schema registry connection 'sr'``)."""

    def __init__(self, client: Any, where: str) -> None:
        self.client = client
        self.where = where

    def version(
        self, subject: str, version: int | str = "latest", *, deleted: bool = False
    ) -> RegisteredSchema:
        what = f"version {version} of subject {subject!r}"
        if version == "latest":
            # not get_latest_version: its cache would keep the first answer for the client's life
            found = self._ask(what, lambda: self.client.get_version(subject, "latest"))
        else:
            found = self._ask(what, lambda: self.client.get_version(subject, int(version), deleted=deleted))
        return _registered(found, subject)

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        found = self._ask(
            f"the versions of subject {subject!r}", lambda: self.client.get_versions(subject, deleted=deleted)
        )
        return sorted(int(v) for v in found)

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        schema = self._ask(f"schema id {schema_id}", lambda: self.client.get_schema(int(schema_id)))
        return RegisteredSchema(
            int(schema_id),
            str(schema.schema_type or "AVRO"),
            str(schema.schema_str),
            references=_references(schema),
        )

    def _ask(self, what: str, call: Callable[[], T]) -> T:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call()
        except SchemaRegistryError as e:
            raise DecoderError(self._explain(what, e)) from None
        except Exception as e:  # the client's transport (httpx) errors: refused, TLS, timeout
            raise DecoderError(
                f"{self.where}: could not read {what}: {type(e).__name__}: {e}; check the connection's "
                "URL and TLS settings and that the registry is up"
            ) from None

    def _explain(self, what: str, e: Any) -> str:
        status, code = int(e.http_status_code), int(e.error_code)
        if status in UNAUTHORIZED or code in UNAUTHORIZED or status == 403:
            fix = "check the connection's user and password, and the user's permissions on the subject"
        elif code == SUBJECT_NOT_FOUND:
            fix = (
                "register the schema (a producer with a registry serializer does it) or name the subject "
                "in the format's options (subject)"
            )
        elif code == VERSION_NOT_FOUND:
            fix = "pin a version the subject has, or 'latest'"
        elif code == SCHEMA_NOT_FOUND:
            fix = "the id is not in this registry: check that producers and this connection use the same registry"
        else:
            fix = "see the registry's message"
        return f"{self.where}: could not read {what}: {e.error_message} (HTTP {status}, error code {code}); {fix}"


def _references(schema: Any) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"name": r.name, "subject": r.subject, "version": r.version}
        for r in (getattr(schema, "references", None) or [])
    )


def _registered(found: Any, subject: str) -> RegisteredSchema:
    schema = found.schema
    return RegisteredSchema(
        int(found.schema_id),
        str(schema.schema_type or "AVRO"),
        str(schema.schema_str),
        subject=found.subject or subject,
        version=int(found.version),
        references=_references(schema),
    )
