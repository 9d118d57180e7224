"""Confluent's wire format, as Spark column expressions: ``[0x00][schema id: 4 bytes, big-endian]
[payload]`` — what confluent-kafka's and Confluent's Java serializers write before an Avro, JSON
Schema or Protobuf payload (Protobuf adds message indexes after the id).

Evaluated in the JVM; pyspark is imported when an expression is built (in the job).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import TOO_SHORT, WRONG_MAGIC_BYTE

MAGIC_BYTE = 0
HEADER_BYTES = 5


def header_reason(raw: Any) -> Any:
    """Why ``raw`` (a binary column) does not start with Confluent's header (null: it does, or
    ``raw`` is null): too short for one, or its first byte is not the magic byte (named in hex)."""
    from pyspark.sql import functions as F

    return (
        F.when(raw.isNull(), F.lit(None).cast("string"))
        .when(
            F.length(raw) < HEADER_BYTES,
            F.concat(
                F.lit(f"{TOO_SHORT} for Confluent's wire format ("),
                F.length(raw).cast("string"),
                F.lit(f" bytes; its header alone is {HEADER_BYTES})"),
            ),
        )
        .when(
            raw.substr(F.lit(1), F.lit(1)) != F.lit(bytes([MAGIC_BYTE])),
            F.concat(
                F.lit(f"{WRONG_MAGIC_BYTE} 0x"),
                F.lower(F.hex(raw.substr(F.lit(1), F.lit(1)))),
                F.lit(f" (Confluent's wire format starts with 0x{MAGIC_BYTE:02x})"),
            ),
        )
    )


def schema_id(raw: Any) -> Any:
    """The schema id of the header (a long column; null where there is no header). A long, not
    an int: four bytes of a payload that is not in the wire format may exceed an int, and Spark's
    ANSI mode would fail the batch on the cast."""
    from pyspark.sql import functions as F

    has_header = (F.length(raw) >= HEADER_BYTES) & (
        raw.substr(F.lit(1), F.lit(1)) == F.lit(bytes([MAGIC_BYTE]))
    )
    return F.when(has_header, F.conv(F.hex(raw.substr(F.lit(2), F.lit(4))), 16, 10).cast("long"))


def header_bytes(schema_id: int) -> bytes:
    """The 5-byte header of a record written with ``schema_id``."""
    return bytes([MAGIC_BYTE]) + int(schema_id).to_bytes(4, "big")


def header(raw: Any) -> Any:
    """The first 5 bytes of ``raw`` (binary column). Compared with :func:`header_bytes` literals,
    a record's schema id is checked as bytes: no per-record hex string and base conversion, which
    :func:`schema_id` costs (about a third of a decode's time on a million records)."""
    from pyspark.sql import functions as F

    return raw.substr(F.lit(1), F.lit(HEADER_BYTES))


def is_one_of(raw: Any, schema_ids: Sequence[int]) -> Any:
    """Whether ``raw`` starts with the header of one of ``schema_ids`` (a boolean column)."""
    from pyspark.sql import functions as F

    if not schema_ids:
        return F.lit(False)
    return header(raw).isin([F.lit(header_bytes(i)) for i in sorted(schema_ids)])


def payload(raw: Any) -> Any:
    """The bytes after the header (binary column)."""
    from pyspark.sql import functions as F

    return raw.substr(F.lit(HEADER_BYTES + 1), F.length(raw) - HEADER_BYTES)


def by_schema_id(raw: Any, decoders: dict[int, Any]) -> Any:
    """One expression per schema id, chosen by the record's id: ``CASE id WHEN 1 THEN e1 ...
    END`` (null for any other id; only the chosen branch is evaluated)."""
    from pyspark.sql import functions as F

    head = header(raw)
    out: Any = None
    for id_, expr in sorted(decoders.items()):
        hit = head == F.lit(header_bytes(id_))
        out = F.when(hit, expr) if out is None else out.when(hit, expr)
    return F.lit(None) if out is None else out
