"""``json``: JSON text parsed into typed columns from a declared schema, in the JVM (Spark's
``from_json``).

**The schema** is one of:

* ``schema`` in the pipelines file: a JSON Schema (an object; :mod:`.json_schema` maps it to Spark's
  types) or Spark DDL (a string, ``"id BIGINT, name STRING"``);
* otherwise a JSON Schema from the registry: ``subject`` (default ``<topic>-<field>`` of the first
  topic) at ``version`` (default ``latest``).

**The bytes**: with a registry schema, Confluent's wire format (what confluent-kafka's
``JSONSerializer`` writes: the magic byte and schema id, then the JSON text); with a declared
schema, plain JSON text. ``confluent_header`` (true/false) says otherwise. Behind a header, an id
that is not a version of the subject(s) when the batch was prepared is an unknown schema id.

**A bad record** is text that is not JSON or does not fit the schema (a string where a number is
declared, an array where an object is): Spark's PERMISSIVE mode puts such text into a corrupt-record
field (:data:`CORRUPT_FIELD`), which the typed value drops. A missing field is null, not an error
(JSON Schema's ``required`` is not enforced), and text after a complete JSON object is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..sql_text import ident, options_map, string
from .base import INVALID_JSON, DecoderError, DecoderSpec, RecordDecoder, SchemaSource
from .json_schema import spark_type
from .wire import bad_header_branch, header_reason, is_one_of, payload, unknown_id_branch

#: the field Spark's from_json fills with the text of a record it cannot parse into the schema
CORRUPT_FIELD = "_kbp_corrupt"


class JsonDecoder(RecordDecoder):
    name = "json"
    doc = (
        "JSON text parsed into typed columns (Spark's from_json, in the JVM) from a declared schema: "
        "a JSON Schema or Spark DDL in the pipelines file, or the subject's JSON Schema in the registry"
    )
    option_docs = {
        "schema": "the declared schema: a JSON Schema object or Spark DDL ('id BIGINT, name STRING'); without it the registry's",
        "subject": "registry subject of the JSON Schema; default: <topic>-key / <topic>-value",
        "version": "the subject's version: latest (the default) or a number",
        "confluent_header": "whether values start with Confluent's 5-byte header; default: true with the registry, false with a declared schema",
    }

    def option_problem(self) -> str | None:
        schema = self.options.get("schema")
        if schema is not None:
            if not isinstance(schema, (dict, str)) or not schema:
                return f"schema must be a JSON Schema object or a Spark DDL string, got {schema!r}"
            if "subject" in self.options or "version" in self.options:
                return "give either schema (declared) or subject/version (the registry's), not both"
            if isinstance(schema, dict):
                spark_type(schema)  # raises DecoderError naming the part Spark cannot type
        version = self.options.get("version", "latest")
        if version != "latest" and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            return f"version must be 'latest' or a number >= 1, got {version!r}"
        header = self.options.get("confluent_header")
        if header is not None and not isinstance(header, bool):
            return f"confluent_header must be true or false, got {header!r}"
        return None

    def uses_registry(self) -> bool:
        return "schema" not in self.options

    def subjects(self, topics: Sequence[str]) -> list[str]:
        if not self.uses_registry():
            return []
        subject = self.options.get("subject")
        return [subject] if subject else [f"{t}-{self.field}" for t in topics]

    def prepare(self, topics: Sequence[str], registry: SchemaSource | None) -> DecoderSpec:
        header = self.options.get("confluent_header", self.uses_registry())
        if not self.uses_registry():
            schema = self.options["schema"]
            resolved: dict[str, Any] = {"header": header, "known_ids": None}
            if isinstance(schema, dict):
                resolved["spark_type"] = spark_type(schema)
            else:
                resolved["ddl"] = schema
            return DecoderSpec(self.name, self.field, self.options, resolved)
        source = self._registry(registry)
        subjects = self.subjects(topics)
        reader = source.version(subjects[0], self.options.get("version", "latest"))
        if reader.schema_type.upper() != "JSON":
            raise DecoderError(
                f"{self.where}: {reader.describe()} is a {reader.schema_type} schema, not a JSON Schema: "
                "choose the format that matches the subject (avro for Avro schemas)"
            )
        try:
            struct = spark_type(json.loads(reader.text))
        except DecoderError as e:
            raise DecoderError(f"{self.where}: {reader.describe()}: {e}") from None
        known = sorted(
            {
                source.version(s, v, deleted=True).schema_id
                for s in subjects
                for v in source.versions(s, deleted=True)
            }
        )
        resolved = {
            "header": header,
            "known_ids": known,
            "spark_type": struct,
            "subjects": subjects,
            "reader": {"subject": reader.subject, "version": reader.version, "id": reader.schema_id},
        }
        return DecoderSpec(self.name, self.field, self.options, resolved)

    def decode(self, raw: str, spec: DecoderSpec) -> str:
        text = f"CAST({payload(raw) if spec.resolved['header'] else raw} AS STRING)"
        if "spark_type" in spec.resolved:
            struct = dict(spec.resolved["spark_type"])
            corrupt = {"name": CORRUPT_FIELD, "type": "string", "nullable": True, "metadata": {}}
            struct["fields"] = [*struct.get("fields", []), corrupt]
            schema = json.dumps(struct, separators=(",", ":"))
        else:
            schema = f"{spec.resolved['ddl']}, {CORRUPT_FIELD} STRING"
        options = options_map({"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_FIELD})
        return f"from_json({text}, {string(schema)}, {options})"

    def reason(self, raw: str, decoded: str, spec: DecoderSpec) -> str:
        parsed = f"{decoded}.{ident(CORRUPT_FIELD)} IS NULL"
        known = spec.resolved["known_ids"]
        header = spec.resolved["header"]
        good = parsed
        if header and known is not None:  # the common case first: a known id, parsed
            good = f"{parsed} AND {is_one_of(raw, known)}"
        elif header:
            good = f"{parsed} AND ({header_reason(raw)}) IS NULL"
        branches = [f"WHEN {raw} IS NULL OR ({good}) THEN NULL"]
        if header:
            branches.append(bad_header_branch(raw))
            if known is not None:
                branches.append(unknown_id_branch(raw, known, spec.resolved["subjects"]))
        what = "JSON text that is not JSON or does not fit the declared schema"
        branches.append(f"WHEN NOT ({parsed}) THEN {string(f'{INVALID_JSON}: {what}')}")
        return "CASE " + " ".join(branches) + " END"

    def markers(self, spec: DecoderSpec) -> tuple[str, ...]:
        return (CORRUPT_FIELD,)
