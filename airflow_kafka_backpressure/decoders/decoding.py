"""A pipeline's decoding as one value: the decoder of each field, the bad-record bound, whether the
raw value is kept; prepared where the registry is (an Airflow task) into the plain JSON the job
spec carries (:meth:`Decoding.to_dict`).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import FIELDS, DecoderError, DecoderSpec, RecordDecoder, SchemaSource

#: what ``max_bad_records`` may be, for the reference and messages
BOUND_RULE = (
    "an integer >= 0 (at most that many bad records per batch), a number between 0 and 1 (at most that "
    "share of the batch's records), or null (no bound: every bad record is set aside)"
)


def bound_problem(bound: Any) -> str | None:
    """What is wrong with a ``max_bad_records`` value (None: nothing)."""
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        return f"must be {BOUND_RULE}"
    if isinstance(bound, int):
        return None if bound >= 0 else f"must be {BOUND_RULE}"
    if math.isfinite(bound) and 0 < bound < 1:
        return None
    return f"must be {BOUND_RULE}; a float is a share of the batch, so it must lie between 0 and 1"


def bad_records_allowed(bound: int | float | None, records: int) -> int | None:
    """How many of a batch's ``records`` may be bad under ``bound`` (None: any number)."""
    if bound is None:
        return None
    if isinstance(bound, int):
        return bound
    return math.floor(bound * records)


def bound_text(bound: int | float | None) -> str:
    """``max_bad_records = 5`` or ``max_bad_records = 0.01 (1% of the batch)``."""
    if isinstance(bound, float):
        return f"max_bad_records = {bound:g} ({bound * 100:g}% of the batch)"
    return f"max_bad_records = {bound}"


@dataclass(frozen=True)
class Decoding:
    """How a batch's records are decoded: the prepared :class:`DecoderSpec` of each field that is
    not ``raw`` (a field without one keeps Kafka's bytes), the bad-record bound and whether the
    raw value lands beside the decoded columns. What the job spec carries, as plain JSON."""

    specs: Mapping[str, DecoderSpec] = field(default_factory=dict)
    max_bad_records: int | float | None = None
    keep_raw_value: bool = False

    def __post_init__(self) -> None:
        problem = bound_problem(self.max_bad_records)
        if problem:
            raise DecoderError(f"max_bad_records = {self.max_bad_records!r} is invalid: {problem}")
        for name, spec in self.specs.items():
            if name not in FIELDS or spec.field != name:
                raise DecoderError(f"a decoder spec of {spec.field!r} is given for {name!r}")

    def allowed(self, records: int) -> int | None:
        return bad_records_allowed(self.max_bad_records, records)

    def to_dict(self) -> dict[str, Any]:
        return {
            "specs": {f: s.to_dict() for f, s in self.specs.items()},
            "max_bad_records": self.max_bad_records,
            "keep_raw_value": self.keep_raw_value,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decoding:
        return cls(
            specs={str(f): DecoderSpec.from_dict(s) for f, s in (d.get("specs") or {}).items()},
            max_bad_records=d.get("max_bad_records"),
            keep_raw_value=bool(d.get("keep_raw_value", False)),
        )


def field_decoders(formats: Mapping[str, tuple[str, Mapping[str, Any] | None]]) -> dict[str, RecordDecoder]:
    """The decoder of each field of ``formats`` (``{"value": ("avro", {...})}``) that is not
    ``raw``; raises :class:`DecoderError` naming the field and the option."""
    from . import DEFAULT_FORMAT, decoder_for

    out = {}
    for name, (fmt, options) in formats.items():
        decoder = decoder_for(fmt, name, options)
        if fmt != DEFAULT_FORMAT or options:
            out[name] = decoder
    return out


def prepare_decoding(
    decoders: Mapping[str, RecordDecoder],
    topics: Sequence[str],
    registry: Callable[[], SchemaSource] | None,
    *,
    max_bad_records: int | float | None = None,
    keep_raw_value: bool = False,
) -> Decoding | None:
    """The :class:`Decoding` a batch of ``topics`` runs with (None: no field is decoded), each
    decoder prepared with the registry that ``registry`` opens (called once, only when a decoder
    reads one; None: the pipeline names no registry, which such a decoder refuses)."""
    if not decoders:
        return None
    source: SchemaSource | None = None
    specs = {}
    for name, decoder in decoders.items():
        if decoder.uses_registry() and source is None and registry is not None:
            source = registry()
        specs[name] = decoder.prepare(topics, source if decoder.uses_registry() else None)
    return Decoding(specs, max_bad_records, keep_raw_value)
