"""A batch's DataFrame decoded once, then split into good rows and bad rows without reading again.

:func:`decode_frame` takes the reader's DataFrame (Kafka's columns: ``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``) and the prepared
:class:`~.base.DecoderSpec` of each decoded field, and adds, per decoded field, its typed column
(:func:`typed_column`: ``_kbp_key``, ``_kbp_value``) and :data:`REASON`: why the record did not
decode (``"value: unknown schema id 9 (…)"``; both fields' reasons joined by ``"; "``; null: it
decoded). The raw ``key`` and ``value`` stay, for the error table. Two projections: the decoders'
expensive step (``from_avro``, ``from_json``) in the first, everything that reads its result in the
second, so Spark evaluates it once per record (a projection is not folded into the next when
that would repeat an expensive expression). A bad record's typed column is not to be read (it may
hold a partial value): every split below filters on :data:`REASON`.

From it, filters of the same (persisted) data:

* :func:`good_rows`: Kafka's columns with ``key``/``value`` replaced by their typed values — the
  raw decoder leaves today's columns exactly as they are;
* :func:`query_rows`: the layout people query: a decoded record value's fields as top-level
  columns, Kafka's metadata under :data:`METADATA_COLUMNS` (``kafka_key`` decoded or raw), the
  raw value only when asked (``kafka_value``);
* :func:`bad_rows`: the error table's rows (:data:`ERROR_TABLE_COLUMNS`);
* :func:`fatal_rows`: bad rows that must fail the batch (:data:`~.base.FATAL_KINDS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import FATAL_KINDS, FIELDS, DecoderError, DecoderSpec

#: why a record did not decode (null: it decoded)
REASON = "_kbp_reason"
#: the error table: where the record was, its raw bytes and why it did not decode
ERROR_TABLE_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value", "reason")
#: Kafka's metadata in :func:`query_rows`, beside the value's fields
METADATA_COLUMNS = {
    "key": "kafka_key",
    "topic": "kafka_topic",
    "partition": "kafka_partition",
    "offset": "kafka_offset",
    "timestamp": "kafka_timestamp",
    "timestampType": "kafka_timestamp_type",
    "headers": "kafka_headers",
}
RAW_VALUE_COLUMN = "kafka_value"
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


def typed_column(field: str) -> str:
    """The column of ``field``'s typed value in :func:`decode_frame`'s DataFrame."""
    return f"_kbp_{field}"


def _decoding_column(field: str) -> str:
    return f"_kbp_{field}_decoding"


def decode_frame(df: Any, specs: Mapping[str, DecoderSpec], *, observe: Any = None) -> Any:
    """``df`` with its ``specs``' fields decoded (module doc); a field without a spec gets no typed
    column (it stays as Kafka holds it). Lazy.

    ``observe``: ``(observation, aggregates)`` for ``DataFrame.observe`` over every decoded record
    (they may read :data:`REASON`), placed before the typed columns are built: a query that reads
    the decoder's output directly (:func:`query_rows`) then builds no typed struct per record.
    The observation is also what keeps Spark from pushing a filter on :data:`REASON` below the
    decode, which would evaluate the decode once more per use; without one, persist the frame
    before splitting it (the batch job does one or the other)."""
    from pyspark.sql import functions as F

    from . import decoder_from_spec

    decoders = {}
    for field, spec in specs.items():
        if field not in FIELDS or spec.field != field:
            raise DecoderError(
                f"the spec of {spec.field!r} is given for {field!r}; fields are {', '.join(FIELDS)}"
            )
        decoders[field] = (decoder_from_spec(spec), spec)
    step1 = df.select(
        *KAFKA_COLUMNS,
        *(d.decode(F.col(f), s).alias(_decoding_column(f)) for f, (d, s) in decoders.items()),
    )
    reasons = []
    for f, (d, s) in decoders.items():
        why = d.reason(F.col(f), F.col(_decoding_column(f)), s) if d.can_fail else None
        if why is not None:
            reasons.append(F.concat(F.lit(f"{f}: "), why))  # null when ``why`` is
    if not reasons:
        reason = F.lit(None).cast("string")
    elif len(reasons) == 1:
        reason = reasons[0]
    else:
        failed = F.lit(False)
        for r in reasons:
            failed = failed | r.isNotNull()
        reason = F.when(failed, F.concat_ws("; ", *reasons))
    step2 = step1.select(*KAFKA_COLUMNS, reason.alias(REASON), *(_decoding_column(f) for f in decoders))
    if observe is not None:
        step2 = step2.observe(observe[0], *observe[1])
    # a bad record's typed value is not read: good_rows and query_rows take the rows whose reason
    # is null, bad_rows the raw bytes (no projection to null it: it would cost every record a copy)
    return step2.select(
        *KAFKA_COLUMNS,
        *(d.typed(F.col(_decoding_column(f)), s).alias(typed_column(f)) for f, (d, s) in decoders.items()),
        REASON,
        *(_decoding_column(f) for f in decoders),
    )


def good_rows(decoded: Any, *, keep_raw: bool = False) -> Any:
    """The records that decoded, in Kafka's columns with ``key``/``value`` typed where decoded
    (``keep_raw``: the raw bytes too, as ``raw_key``/``raw_value``)."""
    from pyspark.sql import functions as F

    columns = set(decoded.columns)
    raw = [F.col(c).alias(f"raw_{c}") for c in ("key", "value")] if keep_raw else []
    return decoded.where(F.col(REASON).isNull()).select(
        *(F.col(typed_column(c)).alias(c) if typed_column(c) in columns else F.col(c) for c in KAFKA_COLUMNS),
        *raw,
    )


def query_rows(decoded: Any, *, keep_raw_value: bool = False) -> Any:
    """The records that decoded, in the layout people query: a record value's fields at the top
    level, Kafka's metadata under :data:`METADATA_COLUMNS`; a value that is not a record (raw
    bytes, a primitive) stays ``value``. ``keep_raw_value``: the raw value too
    (:data:`RAW_VALUE_COLUMN`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    good = good_rows(decoded, keep_raw=keep_raw_value)
    raw = [F.col("raw_value").alias(RAW_VALUE_COLUMN)] if keep_raw_value else []
    metadata = [F.col(c).alias(name) for c, name in METADATA_COLUMNS.items()]
    value_type = good.schema["value"].dataType
    if not isinstance(value_type, StructType):
        return good.select(F.col("value"), *metadata, *raw)
    clash = sorted({f.name for f in value_type.fields} & {*METADATA_COLUMNS.values(), RAW_VALUE_COLUMN})
    if clash:
        raise DecoderError(
            f"the value's fields {', '.join(map(repr, clash))} have the names of Kafka's metadata columns; rename them"
        )
    # each field straight from the decoder's output where the typed value only dropped fields of it
    # (the decoders' own markers): no record is copied into a new struct first
    source = F.col("value")
    decoding = _decoding_column("value")
    if decoding in decoded.columns:
        inner = decoded.schema[decoding].dataType
        own = {f.name: f.dataType for f in inner.fields} if isinstance(inner, StructType) else {}
        if all(own.get(f.name) == f.dataType for f in value_type.fields):
            good = decoded.where(F.col(REASON).isNull()).select(
                *(
                    F.col(typed_column(c)).alias(c) if typed_column(c) in decoded.columns else F.col(c)
                    for c in KAFKA_COLUMNS
                    if c != "value"
                ),
                F.col(decoding).alias("value"),
                *([F.col("value").alias("raw_value")] if keep_raw_value else []),
            )
    return good.select(*(source[f.name].alias(f.name) for f in value_type.fields), *metadata, *raw)


def bad_rows(decoded: Any) -> Any:
    """The records that did not decode, as the error table holds them (:data:`ERROR_TABLE_COLUMNS`:
    the raw key and value, and the reason)."""
    from pyspark.sql import functions as F

    return decoded.where(F.col(REASON).isNotNull()).select(
        "topic", "partition", "offset", "timestamp", "key", "value", F.col(REASON).alias("reason")
    )


def is_fatal() -> Any:
    """Whether a decoded record's :data:`REASON` fails the batch (:data:`~.base.FATAL_KINDS`; a
    boolean column, false for a record that decoded)."""
    from pyspark.sql import functions as F

    reason = F.col(REASON)
    fatal = F.lit(False)
    for kind in FATAL_KINDS:
        fatal = fatal | reason.contains(f": {kind}")
    return reason.isNotNull() & fatal


def fatal_rows(decoded: Any) -> Any:
    """The bad records whose reason fails the batch (:data:`~.base.FATAL_KINDS`)."""
    return bad_rows(decoded).where(is_fatal())
