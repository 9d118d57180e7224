"""``avro``: Confluent's wire format with an Avro payload, read into one reader schema.

**Schemas (prepare, where the registry is).** The reader schema is one version of one subject:
``subject`` (default: the first topic's ``<topic>-<field>``, Confluent's TopicNameStrategy) at
``version`` (default ``latest``; a number pins it). The writer schemas are every version, soft-deleted
ones included, of each topic's subject (or of ``subject`` when it is set): a record in a planned
range was produced after its schema was registered, so when the batch is prepared after it is
planned every schema id of its records is among them — an id that is not is an unknown schema id
(a schema registered under another subject, or a record that only looks like the wire format).
Each writer schema is checked against the reader by Avro's schema resolution (Apache Avro's
checker, the rules of Confluent's BACKWARD compatibility); one the reader cannot read is kept as
a reason, not a schema: its records fail the batch, naming the subject, both versions and the
field.

**Decoding (the job).** One ``from_avro(payload, writerSchema, {"avroSchema": readerSchema,
"mode": "PERMISSIVE"})`` per writer schema id (Spark's ``spark-avro``: Avro's resolving decoder, in
the JVM), chosen by the record's id. PERMISSIVE gives a row of nulls for a payload Avro cannot read;
to tell it from a record whose fields are all null, the reader schema used in the job has one more
field, :data:`DECODED_MARK` (boolean, default true), which Avro fills in from its default on every
record it reads: null there is a corrupt payload. The mark is dropped from the typed value.

Limits: schema references are refused (their named types would have to be inlined); bytes after
a complete record are not detected (Avro's binary encoding has no length or checksum — Confluent's
deserializers do not detect them either); a top-level union with null cannot tell a corrupt payload
from a null.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..sql_text import binary, ident, options_map, string
from .base import (
    CORRUPT_PAYLOAD,
    INCOMPATIBLE_SCHEMA,
    DecoderError,
    DecoderSpec,
    RecordDecoder,
    RegisteredSchema,
    SchemaSource,
)
from .wire import bad_header_branch, by_schema_id, header, header_bytes, payload, schema_id, unknown_id_branch

#: the field the job's reader schema adds to a record schema: true on every record Avro reads
DECODED_MARK = "_kbp_decoded"
#: the Maven artifact of Spark's Avro functions (at the job's Spark version)
SPARK_AVRO_ARTIFACT = "org.apache.spark:spark-avro_2.13"


def incompatibility(reader: RegisteredSchema, writer: RegisteredSchema) -> str | None:
    """Why records written with ``writer`` cannot be read as ``reader`` by Avro's schema resolution
    (None: they can), naming both and the fields. Apache Avro's own checker (Python port of Java's
    ``SchemaCompatibility``)."""
    import avro.schema
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    result = ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(reader.text), avro.schema.parse(writer.text)
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return None
    what = ", ".join(sorted(k.value.replace("_", " ") for k in result.incompatibilities))
    fields = ", ".join(sorted(result.messages))
    at = ", ".join(sorted(result.locations))
    return (
        f"{writer.describe()} cannot be read as {reader.describe()}: {what} (field {fields} at {at}); "
        "make the change compatible (a new field needs a default) or pin the reader version"
    )


def marked_reader(text: str) -> str:
    """The reader schema as the job uses it: a record gets :data:`DECODED_MARK` (boolean,
    default true); any other type is returned as it is."""
    if not _is_record(text):
        return text
    schema = json.loads(text)
    if any(f.get("name") == DECODED_MARK for f in schema.get("fields", [])):
        raise DecoderError(
            f"the reader schema has a field named {DECODED_MARK!r}, which the avro decoder uses"
        )
    schema["fields"] = [*schema.get("fields", []), {"name": DECODED_MARK, "type": "boolean", "default": True}]
    return json.dumps(schema, separators=(",", ":"))


class AvroDecoder(RecordDecoder):
    name = "avro"
    doc = (
        "Confluent's wire format (magic byte, schema id) with an Avro payload: writer schemas from "
        "the schema registry, every record read into one reader schema (the subject's latest or a "
        "pinned version) by Avro's schema resolution, in the JVM (spark-avro's from_avro)"
    )
    spark_artifacts = (SPARK_AVRO_ARTIFACT,)
    option_docs = {
        "subject": "the registry subject of the reader schema and of the writer schemas; default: <topic>-key / <topic>-value",
        "version": "the reader schema's version of the subject: latest (the default) or a number",
    }

    def option_problem(self) -> str | None:
        subject, version = self.options.get("subject"), self.options.get("version", "latest")
        if subject is not None and (not isinstance(subject, str) or not subject):
            return f"subject must be a non-empty string, got {subject!r}"
        if version != "latest" and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            return f"version must be 'latest' or a number >= 1, got {version!r}"
        return None

    def uses_registry(self) -> bool:
        return True

    def subjects(self, topics: Sequence[str]) -> list[str]:
        subject = self.options.get("subject")
        return [subject] if subject else [f"{t}-{self.field}" for t in topics]

    def prepare(self, topics: Sequence[str], registry: SchemaSource | None) -> DecoderSpec:
        source = self._registry(registry)
        subjects = self.subjects(topics)
        if not subjects:
            raise DecoderError(f"{self.where}: no topics to read schemas for")
        reader = source.version(subjects[0], self.options.get("version", "latest"))
        _check_avro(reader, self.where)
        writers: dict[str, dict[str, Any]] = {}
        incompatible: dict[str, str] = {}
        for subject in subjects:
            for number in source.versions(subject, deleted=True):
                writer = source.version(subject, number, deleted=True)
                key = str(writer.schema_id)
                if key in writers or key in incompatible:
                    continue
                _check_avro(writer, self.where)
                problem = None if writer.schema_id == reader.schema_id else incompatibility(reader, writer)
                if problem:
                    incompatible[key] = problem
                else:
                    writers[key] = {"subject": subject, "version": number, "schema": writer.text}
        resolved = {
            "reader": {
                "subject": reader.subject,
                "version": reader.version,
                "id": reader.schema_id,
                "schema": marked_reader(reader.text),
                "record": _is_record(reader.text),
            },
            "subjects": subjects,
            "writers": writers,
            "incompatible": incompatible,
        }
        return DecoderSpec(self.name, self.field, self.options, resolved)

    def session_problem(self, spark: Any) -> str | None:
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        try:
            spark.range(1).select(from_avro(F.lit(b"\x02"), '"int"')).collect()
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return (
                f"{self.where} needs Spark's Avro functions, which this Spark session cannot run ({first}): "
                f"put {', '.join(self.spark_artifacts)} at the job's Spark version on its classpath "
                "(spark.jars.packages, or the jar in spark.jars)"
            )
        return None

    def decode(self, raw: str, spec: DecoderSpec) -> str:
        reader = spec.resolved["reader"]["schema"]
        options = options_map({"avroSchema": reader, "mode": "PERMISSIVE"})
        data = payload(raw)
        return by_schema_id(
            raw,
            {
                int(id_): f"from_avro({data}, {string(w['schema'])}, {options})"
                for id_, w in spec.resolved["writers"].items()
            },
        )

    def reason(self, raw: str, decoded: str, spec: DecoderSpec) -> str:
        reader = spec.resolved["reader"]
        # the decode is null for a header that is not a known writer's, so "Avro read it" alone
        # tells the common case: one test per record, no second look at the header
        failed = f"{decoded}.{ident(DECODED_MARK)} IS NULL" if reader["record"] else f"{decoded} IS NULL"
        sid = f"CAST({schema_id(raw)} AS STRING)"
        branches = [f"WHEN {raw} IS NULL OR NOT ({failed}) THEN NULL", bad_header_branch(raw)]
        for id_, problem in sorted(spec.resolved["incompatible"].items()):
            text = string(f"{INCOMPATIBLE_SCHEMA}: {problem}")
            branches.append(f"WHEN {header(raw)} = {binary(header_bytes(int(id_)))} THEN {text}")
        known = [int(i) for i in spec.resolved["writers"]]
        branches.append(unknown_id_branch(raw, known, spec.resolved["subjects"]))
        corrupt = string(f"{CORRUPT_PAYLOAD}: Avro could not read it as schema id ")
        into = string(f" (into subject {reader['subject']!r} version {reader['version']})")
        branches.append(f"WHEN {failed} THEN concat({corrupt}, {sid}, {into})")
        return "CASE " + " ".join(branches) + " END"

    def markers(self, spec: DecoderSpec) -> tuple[str, ...]:
        return (DECODED_MARK,) if spec.resolved["reader"]["record"] else ()


def _is_record(text: str) -> bool:
    schema = json.loads(text)
    return isinstance(schema, dict) and schema.get("type") == "record"


def _check_avro(schema: RegisteredSchema, where: str) -> None:
    if schema.schema_type.upper() != "AVRO":
        raise DecoderError(
            f"{where}: {schema.describe()} is a {schema.schema_type} schema, not Avro: "
            "choose the format that matches the subject (json for JSON schemas)"
        )
    if schema.references:
        raise DecoderError(
            f"{where}: {schema.describe()} uses schema references, which the avro decoder does not "
            "resolve yet: register the schema with its named types inlined"
        )
