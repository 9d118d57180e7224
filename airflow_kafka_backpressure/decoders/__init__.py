"""Record decoders: how the bytes of a record's key and value become typed columns, and which
records are set aside because they do not decode. One interface (:class:`~.base.RecordDecoder`),
one registry (:data:`DECODERS`).

A pipeline chooses a format per field (``key_format``, ``value_format``: a name of
:data:`DECODERS`, default ``raw``) with its options. The pipelines file's validation, the
generated reference, the batch job and the docs read this registry; nothing else names a format.
Adding one is a module with a :class:`~.base.RecordDecoder` and a line here (or :func:`register`).

* ``raw`` (:mod:`.raw_decoder`): the bytes, unchanged — today's columns; nothing is set aside;
* ``avro`` (:mod:`.avro_decoder`): Confluent's wire format; writer schemas by id from the schema
  registry, every record read into one reader schema by Avro's schema resolution, in the JVM
  (spark-avro's ``from_avro``);
* ``json`` (:mod:`.json_decoder`): JSON text into a declared schema (the pipelines file's, or the
  registry's JSON Schema), in the JVM (``from_json``).

**Where each part runs.** Credentials stay where the connection is:

1. the pipelines file's validation constructs each decoder (:func:`decoder_for`): a wrong option
   fails there, naming the key;
2. an Airflow task that can reach the registry (``schema_registry`` connection,
   :class:`~..hooks.schema_registry.SchemaRegistryHook` → :class:`~.registry.ConfluentSchemas`)
   calls :meth:`~.base.RecordDecoder.prepare`: the schemas the batch needs, checked, as a
   :class:`~.base.DecoderSpec` of schema text and ids — plain JSON the job spec carries, with no
   URL or credential;
3. the Spark job builds column expressions (Spark SQL text, :mod:`..sql_text`) from the specs
   (:func:`~.frame.decode_frame`), decodes each record once, in the JVM, and splits the same data
   into good rows (:func:`~.frame.good_rows`, :func:`~.frame.query_rows`) and the error table's
   rows (:func:`~.frame.bad_rows`), each bad record with a reason that starts with one of
   :data:`~.base.REASON_KINDS`; a reason of :data:`~.base.FATAL_KINDS` (:func:`~.frame.fatal_rows`)
   fails the batch instead.

No protobuf decoder yet: Spark's ``spark-protobuf`` for Spark 4.2 is not published on Maven
Central.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .avro_decoder import AvroDecoder
from .base import (
    FATAL_KINDS,
    FIELDS,
    REASON_KINDS,
    DecoderError,
    DecoderSpec,
    RecordDecoder,
    RegisteredSchema,
    SchemaSource,
)
from .json_decoder import JsonDecoder
from .raw_decoder import RawDecoder

#: Every record format by name, the default first; validation, dispatch and the docs read it.
DECODERS: dict[str, type[RecordDecoder]] = {
    RawDecoder.name: RawDecoder,
    AvroDecoder.name: AvroDecoder,
    JsonDecoder.name: JsonDecoder,
}
#: The format of a field whose pipeline names none.
DEFAULT_FORMAT = RawDecoder.name


def decoder_names() -> tuple[str, ...]:
    """What a pipeline's ``key_format`` / ``value_format`` may be."""
    return tuple(DECODERS)


def register(decoder: type[RecordDecoder]) -> type[RecordDecoder]:
    """Add ``decoder`` to :data:`DECODERS` under its ``name`` (usable as a class decorator)."""
    if not getattr(decoder, "name", None):
        raise ValueError(f"{decoder.__name__} has no name: set the class attribute 'name'")
    DECODERS[decoder.name] = decoder
    return decoder


def decoder_for(name: str, field: str, options: Mapping[str, Any] | None = None) -> RecordDecoder:
    """The decoder called ``name`` for ``field`` (``key`` or ``value``) with ``options`` (checked)."""
    try:
        kind = DECODERS[name]
    except KeyError:
        raise DecoderError(
            f"unknown {field}_format {name!r}: choose one of {', '.join(decoder_names())}"
        ) from None
    return kind(field, options)


def decoder_from_spec(spec: DecoderSpec) -> RecordDecoder:
    """The decoder that prepared ``spec``."""
    return decoder_for(spec.name, spec.field, spec.options)


__all__ = [
    "DECODERS",
    "DEFAULT_FORMAT",
    "FATAL_KINDS",
    "FIELDS",
    "REASON_KINDS",
    "AvroDecoder",
    "DecoderError",
    "DecoderSpec",
    "JsonDecoder",
    "RawDecoder",
    "RecordDecoder",
    "RegisteredSchema",
    "SchemaSource",
    "decoder_for",
    "decoder_from_spec",
    "decoder_names",
    "register",
]
