"""The interface every record decoder implements: Kafka's bytes of a key or a value into typed
columns, and for each record that does not decode, why.

Pure: no Airflow, Spark or Kafka import at module level (the Spark side's expressions import
pyspark when they are built, in the job).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, ClassVar, Protocol

#: The columns of Kafka's records a decoder may decode.
FIELDS = ("key", "value")

# Why a record did not decode: every reason a decoder gives starts with one of these kinds (the
# error table's ``reason`` and the batch's bad-record counts by kind read them).
WRONG_MAGIC_BYTE = "wrong magic byte"
TOO_SHORT = "too short"
UNKNOWN_SCHEMA_ID = "unknown schema id"
CORRUPT_PAYLOAD = "corrupt payload"
INVALID_JSON = "invalid JSON"
#: a record written with a schema the batch's reader schema cannot read: not a bad record but a
#: broken contract, so it fails the batch (issue 41: "an incompatible change fails the batch")
INCOMPATIBLE_SCHEMA = "incompatible schema"
REASON_KINDS = (
    WRONG_MAGIC_BYTE,
    TOO_SHORT,
    UNKNOWN_SCHEMA_ID,
    CORRUPT_PAYLOAD,
    INVALID_JSON,
    INCOMPATIBLE_SCHEMA,
)
#: kinds that fail the batch instead of setting the record aside
FATAL_KINDS = (INCOMPATIBLE_SCHEMA,)


class DecoderError(ValueError):
    """A decoder cannot be set up as asked (options, a subject, a schema); the message names the
    field, the thing and what to do."""


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as a registry holds it: its global id, type (``AVRO``, ``JSON``, ``PROTOBUF``),
    text and references; ``subject`` and ``version`` when it was read as a subject's version."""

    schema_id: int
    schema_type: str
    text: str
    subject: str | None = None
    version: int | None = None
    references: tuple[Mapping[str, Any], ...] = ()

    def describe(self) -> str:
        """``subject 'orders-value' version 2 (id 7)`` or ``schema id 7``."""
        if self.subject is None:
            return f"schema id {self.schema_id}"
        return f"subject {self.subject!r} version {self.version} (id {self.schema_id})"


class SchemaSource(Protocol):
    """Where a decoder's :meth:`~RecordDecoder.prepare` reads schemas: a schema registry, through
    a maintained client (:class:`~.registry.ConfluentSchemas`). Raises :class:`DecoderError`
    naming ``where`` and the subject, version or id it could not read."""

    where: str

    def version(
        self, subject: str, version: int | str = "latest", *, deleted: bool = False
    ) -> RegisteredSchema:
        """The subject's ``version`` (a number or ``latest``); ``deleted``: soft-deleted ones too."""

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        """The subject's version numbers, oldest first; ``deleted``: soft-deleted ones too."""

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema with the global id ``schema_id``."""


@dataclass(frozen=True)
class DecoderSpec:
    """What the batch job needs to decode one field, prepared where the registry is reachable: the
    decoder's ``name``, the ``field`` (``key`` or ``value``), the pipeline's ``options`` for it and
    what :meth:`RecordDecoder.prepare` resolved (schema texts, ids, versions). Plain JSON, and never
    a registry URL or credential: the job decodes from schema text alone."""

    name: str
    field: str
    options: Mapping[str, Any] = dataclass_field(default_factory=dict)
    resolved: Mapping[str, Any] = dataclass_field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "field": self.field,
            "options": dict(self.options),
            "resolved": json.loads(json.dumps(self.resolved)),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecoderSpec:
        return cls(
            str(d["name"]), str(d["field"]), dict(d.get("options") or {}), dict(d.get("resolved") or {})
        )


class RecordDecoder(ABC):
    """How one field (``key`` or ``value``) of a pipeline's records becomes typed columns.

    Three moments:

    1. construction (the pipelines file's validation): the options are checked; a wrong one is a
       :class:`DecoderError` naming the key;
    2. :meth:`prepare`, where the registry is reachable (an Airflow task): the schemas the job will
       need are read and checked, into a :class:`DecoderSpec` of schema text;
    3. in the job, column expressions as Spark SQL text (:mod:`..sql_text`: evaluated in the JVM, never
       row by row in Python; one parse per projection, no round trip to the JVM per expression
       node), in two projections so an expensive decode runs once per record: :meth:`decode` (the
       decoded value, null or marked when it does not decode), then :meth:`reason` (why not, from
       the raw bytes and the decoded value; null: decoded). The value the sink gets is the decoded
       one without the decoder's own :meth:`markers`.
    """

    #: the name a pipeline's ``key_format`` / ``value_format`` gives
    name: ClassVar[str]
    #: one line for the generated reference
    doc: ClassVar[str] = ""
    #: the options this decoder takes, with their docs
    option_docs: ClassVar[Mapping[str, str]] = {}
    #: whether any record can fail to decode (False: nothing is ever set aside)
    can_fail: ClassVar[bool] = True
    #: Maven artifacts (``group:artifact``, at the job's Spark version) the job's Spark needs on its
    #: classpath for this format: what an engine adds to ``spark.jars.packages`` or a cluster has
    spark_artifacts: ClassVar[tuple[str, ...]] = ()

    def __init__(self, field: str, options: Mapping[str, Any] | None = None) -> None:
        if field not in FIELDS:
            raise DecoderError(f"a decoder decodes one of {', '.join(FIELDS)}, not {field!r}")
        self.field = field
        self.options: dict[str, Any] = dict(options or {})
        unknown = sorted(set(self.options) - set(self.option_docs))
        if unknown:
            known = ", ".join(sorted(self.option_docs)) or "none"
            raise DecoderError(
                f"{self.where}: unknown option(s) {', '.join(map(repr, unknown))} (this format takes: {known})"
            )
        problem = self.option_problem()
        if problem:
            raise DecoderError(f"{self.where}: {problem}")

    @property
    def where(self) -> str:
        """``the value's avro format``: how messages name this decoder."""
        return f"the {self.field}'s {self.name} format"

    def option_problem(self) -> str | None:
        """What is wrong with the options (None: nothing), with the fix."""
        return None

    def uses_registry(self) -> bool:
        """Whether :meth:`prepare` reads a schema registry (the pipeline must name one)."""
        return False

    def subjects(self, topics: Sequence[str]) -> list[str]:
        """The registry subjects this decoder reads for ``topics`` (empty without a registry)."""
        return []

    @abstractmethod
    def prepare(self, topics: Sequence[str], registry: SchemaSource | None) -> DecoderSpec:
        """The :class:`DecoderSpec` a batch of ``topics`` is decoded with (``registry``: where its
        schemas are, None when :meth:`uses_registry` is False); raises :class:`DecoderError`."""

    def session_problem(self, spark: Any) -> str | None:
        """Why the job's ``spark`` session cannot run this decoder (a missing package), with the
        fix; None: it can."""
        return None

    @abstractmethod
    def decode(self, raw: str, spec: DecoderSpec) -> str:
        """Step 1: the decoded value of the ``raw`` bytes (SQL text of a binary column), as SQL text
        (null, or marked, when it does not decode); may be expensive (it runs once per record)."""

    def reason(self, raw: str, decoded: str, spec: DecoderSpec) -> str | None:
        """Step 2: why the record did not decode, SQL text of a string starting with one of
        :data:`REASON_KINDS` (null: it decoded), from the raw bytes and the column of step 1 (both
        SQL text); None when no record can fail (:attr:`can_fail`)."""
        return None

    def markers(self, spec: DecoderSpec) -> tuple[str, ...]:
        """Fields of the decoded struct that are this decoder's own (a mark it reads in
        :meth:`reason`), dropped from the value the sink gets; default: none."""
        return ()

    def _registry(self, registry: SchemaSource | None) -> SchemaSource:
        if registry is None:
            raise DecoderError(
                f"{self.where} reads its schemas from a schema registry: set the pipeline's "
                "schema_registry_conn_id to a connection of type schema_registry"
            )
        return registry
