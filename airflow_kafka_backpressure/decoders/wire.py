"""Confluent's wire format, as Spark SQL expressions: ``[0x00][schema id: 4 bytes, big-endian]
[payload]`` — what confluent-kafka's and Confluent's Java serializers write before an Avro, JSON
Schema or Protobuf payload (Protobuf adds message indexes after the id).

Each function takes the SQL text of a binary column (``raw``) and returns SQL text (:mod:`..sql_text`),
evaluated in the JVM. Pure: no pyspark import.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sql_text import binary, string
from .base import TOO_SHORT, UNKNOWN_SCHEMA_ID, WRONG_MAGIC_BYTE

MAGIC_BYTE = 0
HEADER_BYTES = 5


def header_reason(raw: str) -> str:
    """Why ``raw`` does not start with Confluent's header (null: it does, or ``raw`` is null): too
    short for one, or its first byte is not the magic byte (named in hex)."""
    short_of = TOO_SHORT + " for Confluent's wire format ("
    too_short = (
        f"concat({string(short_of)}, CAST(length({raw}) AS STRING), "
        f"{string(f' bytes; its header alone is {HEADER_BYTES})')})"
    )
    starts = f" (Confluent's wire format starts with 0x{MAGIC_BYTE:02x})"
    wrong_magic = (
        f"concat({string(WRONG_MAGIC_BYTE + ' 0x')}, lower(hex(substr({raw}, 1, 1))), {string(starts)})"
    )
    return (
        f"CASE WHEN {raw} IS NULL THEN NULL WHEN length({raw}) < {HEADER_BYTES} THEN {too_short} "
        f"WHEN substr({raw}, 1, 1) <> {binary(bytes([MAGIC_BYTE]))} THEN {wrong_magic} END"
    )


def schema_id(raw: str) -> str:
    """The schema id of the header (a bigint; null where there is no header). A bigint, not an
    int: four bytes of a payload that is not in the wire format may exceed an int, and Spark's
    ANSI mode would fail the batch on the cast."""
    has_header = f"length({raw}) >= {HEADER_BYTES} AND substr({raw}, 1, 1) = {binary(bytes([MAGIC_BYTE]))}"
    return f"CASE WHEN {has_header} THEN CAST(conv(hex(substr({raw}, 2, 4)), 16, 10) AS BIGINT) END"


def header_bytes(schema_id: int) -> bytes:
    """The 5-byte header of a record written with ``schema_id``."""
    return bytes([MAGIC_BYTE]) + int(schema_id).to_bytes(4, "big")


def header(raw: str) -> str:
    """The first 5 bytes of ``raw``. Compared with :func:`header_bytes` literals, a record's schema
    id is checked as bytes: no per-record hex string and base conversion, which :func:`schema_id`
    costs (about a third of a decode's time on a million records)."""
    return f"substr({raw}, 1, {HEADER_BYTES})"


def is_one_of(raw: str, schema_ids: Sequence[int]) -> str:
    """Whether ``raw`` starts with the header of one of ``schema_ids`` (boolean)."""
    if not schema_ids:
        return "false"
    return f"{header(raw)} IN ({', '.join(binary(header_bytes(i)) for i in sorted(schema_ids))})"


def payload(raw: str) -> str:
    """The bytes after the header."""
    return f"substr({raw}, {HEADER_BYTES + 1})"


def by_schema_id(raw: str, decoders: dict[int, str]) -> str:
    """One expression per schema id, chosen by the record's id: ``CASE WHEN header = id1 THEN e1
    ... END`` (null for any other id; only the chosen branch is evaluated)."""
    if not decoders:
        return "NULL"
    branches = " ".join(
        f"WHEN {header(raw)} = {binary(header_bytes(id_))} THEN {expr}"
        for id_, expr in sorted(decoders.items())
    )
    return f"CASE {branches} END"


def bad_header_branch(raw: str) -> str:
    """A ``CASE`` branch giving :func:`header_reason` where ``raw`` has no Confluent header."""
    why = header_reason(raw)
    return f"WHEN ({why}) IS NOT NULL THEN {why}"


def unknown_id_branch(raw: str, known: Sequence[int], subjects: Sequence[str]) -> str:
    """A ``CASE`` branch naming the schema id of a header that is none of ``known`` (the versions
    of ``subjects`` when the batch was prepared)."""
    named = ", ".join(map(repr, subjects))
    return (
        f"WHEN NOT ({is_one_of(raw, known)}) THEN concat({string(f'{UNKNOWN_SCHEMA_ID} ')}, "
        f"CAST({schema_id(raw)} AS STRING), {string(f' (not a version of {named} when the batch was prepared)')})"
    )
