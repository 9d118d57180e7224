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

from ..sql_text import NULL_STRING, any_of, ident, string
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


def _kept_fields(schema: Any, field: str, markers: tuple[str, ...]) -> list[str] | None:
    """The fields of ``field``'s decoded struct (in ``schema``, a frame's) that the sink gets (all
    but the decoder's ``markers``), or None when the decoded value is not a struct."""
    from pyspark.sql.types import StructType

    kind = schema[_decoding_column(field)].dataType
    if not isinstance(kind, StructType):
        return None
    return [f.name for f in kind.fields if f.name not in markers]


def decode_frame(df: Any, specs: Mapping[str, DecoderSpec], *, observe: Any = None) -> Any:
    """``df`` with its ``specs``' fields decoded (module doc); a field without a spec gets no typed
    column (it stays as Kafka holds it). Lazy.

    ``observe``: ``(observation, aggregates)`` for ``DataFrame.observe`` over every decoded record
    (they may read :data:`REASON`), placed before the typed columns are built: a query that reads
    the decoder's output directly (:func:`query_rows`) then builds no typed struct per record.
    The observation is also what keeps Spark from pushing a filter on :data:`REASON` below the
    decode, which would evaluate the decode once more per use; without one, persist the frame
    before splitting it (the batch job does one or the other).

    Each projection goes to Spark as SQL text, one ``selectExpr`` (:mod:`..sql_text`)."""
    from . import decoder_from_spec

    decoders = {}
    for field, spec in specs.items():
        if field not in FIELDS or spec.field != field:
            raise DecoderError(
                f"the spec of {spec.field!r} is given for {field!r}; fields are {', '.join(FIELDS)}"
            )
        decoders[field] = (decoder_from_spec(spec), spec)
    kafka = [ident(c) for c in KAFKA_COLUMNS]
    decoding = [ident(_decoding_column(f)) for f in decoders]
    step1 = df.selectExpr(
        *kafka,
        *(f"{d.decode(ident(f), s)} AS {ident(_decoding_column(f))}" for f, (d, s) in decoders.items()),
    )
    reasons = []
    for f, (d, s) in decoders.items():
        why = d.reason(ident(f), ident(_decoding_column(f)), s) if d.can_fail else None
        if why is not None:
            reasons.append(f"concat({string(f'{f}: ')}, {why})")  # null when ``why`` is
    if not reasons:
        reason = NULL_STRING
    elif len(reasons) == 1:
        reason = reasons[0]
    else:
        failed = any_of(f"{r} IS NOT NULL" for r in reasons)
        reason = f"CASE WHEN {failed} THEN concat_ws('; ', {', '.join(reasons)}) END"
    # a bad record's typed value is not read: good_rows and query_rows take the rows whose reason
    # is null, bad_rows the raw bytes (no projection to null it: it would cost every record a copy)
    typed = []
    marked = {f: d.markers(s) for f, (d, s) in decoders.items()}
    schema = step1.schema if any(marked.values()) else None  # one analysis for every field
    for f in decoders:
        source = ident(_decoding_column(f))
        markers = marked[f]
        kept = _kept_fields(schema, f, markers) if markers else None
        if kept is None:
            typed.append(f"{source} AS {ident(typed_column(f))}")
        else:
            fields = ", ".join(f"{string(n)}, {source}.{ident(n)}" for n in kept)
            typed.append(
                f"CASE WHEN {source} IS NULL THEN NULL ELSE named_struct({fields}) END AS {ident(typed_column(f))}"
            )
    # the typed values beside the reason: a query that reads neither (query_rows reads the
    # decoder's output) has them pruned, and the frame is one projection fewer for Spark to analyse
    step2 = step1.selectExpr(*kafka, *typed, f"{reason} AS {ident(REASON)}", *decoding)
    if observe is not None:
        step2 = step2.observe(observe[0], *observe[1])
    return step2


def good_rows(decoded: Any, *, keep_raw: bool = False) -> Any:
    """The records that decoded, in Kafka's columns with ``key``/``value`` typed where decoded
    (``keep_raw``: the raw bytes too, as ``raw_key``/``raw_value``)."""
    columns = set(decoded.columns)
    raw = [f"{ident(c)} AS {ident(f'raw_{c}')}" for c in ("key", "value")] if keep_raw else []
    return decoded.where(f"{ident(REASON)} IS NULL").selectExpr(
        *(
            f"{ident(typed_column(c))} AS {ident(c)}" if typed_column(c) in columns else ident(c)
            for c in KAFKA_COLUMNS
        ),
        *raw,
    )


def query_rows(decoded: Any, *, keep_raw_value: bool = False) -> Any:
    """The records that decoded, in the layout people query: a record value's fields at the top
    level, Kafka's metadata under :data:`METADATA_COLUMNS`; a value that is not a record (raw
    bytes, a primitive) stays ``value``. ``keep_raw_value``: the raw value too
    (:data:`RAW_VALUE_COLUMN`)."""
    from pyspark.sql.types import StructType

    schema = decoded.schema
    columns = set(schema.fieldNames())
    key = ident(typed_column("key")) if typed_column("key") in columns else ident("key")
    metadata = [f"{key if c == 'key' else ident(c)} AS {ident(name)}" for c, name in METADATA_COLUMNS.items()]
    raw = [f"{ident('value')} AS {ident(RAW_VALUE_COLUMN)}"] if keep_raw_value else []
    good = decoded.where(f"{ident(REASON)} IS NULL")
    typed = typed_column("value")
    value_type = schema[typed].dataType if typed in columns else schema["value"].dataType
    if not isinstance(value_type, StructType):
        value = ident(typed) if typed in columns else ident("value")
        return good.selectExpr(f"{value} AS {ident('value')}", *metadata, *raw)
    names = value_type.fieldNames()
    clash = sorted(set(names) & {*METADATA_COLUMNS.values(), RAW_VALUE_COLUMN})
    if clash:
        raise DecoderError(
            f"the value's fields {', '.join(map(repr, clash))} have the names of Kafka's metadata columns; rename them"
        )
    # each field straight from the decoder's output (the typed value is it without the decoder's
    # markers): no record is copied into a new struct first
    source = ident(_decoding_column("value")) if _decoding_column("value") in columns else ident(typed)
    return good.selectExpr(*(f"{source}.{ident(n)} AS {ident(n)}" for n in names), *metadata, *raw)


def bad_rows(decoded: Any) -> Any:
    """The records that did not decode, as the error table holds them (:data:`ERROR_TABLE_COLUMNS`:
    the raw key and value, and the reason)."""
    return decoded.where(f"{ident(REASON)} IS NOT NULL").selectExpr(
        *(ident(c) for c in ("topic", "partition", "offset", "timestamp", "key", "value")),
        f"{ident(REASON)} AS {ident('reason')}",
    )


def is_fatal(column: str = REASON) -> str:
    """Whether a decoded record's reason (in ``column``) fails the batch
    (:data:`~.base.FATAL_KINDS`), as SQL text of a boolean, false for a record that decoded."""
    kinds = any_of(f"contains({ident(column)}, {string(f': {kind}')})" for kind in FATAL_KINDS)
    return f"{ident(column)} IS NOT NULL AND ({kinds})"


def fatal_rows(decoded: Any) -> Any:
    """The bad records whose reason fails the batch (:data:`~.base.FATAL_KINDS`)."""
    return bad_rows(decoded).where(is_fatal("reason"))
