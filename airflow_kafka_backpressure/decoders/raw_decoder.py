"""``raw``: the bytes as Kafka holds them (today's ``key`` and ``value`` columns, unchanged)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import DecoderSpec, RecordDecoder, SchemaSource


class RawDecoder(RecordDecoder):
    name = "raw"
    doc = "the bytes as Kafka holds them (binary columns), unchanged; nothing is set aside"
    can_fail = False

    def prepare(self, topics: Sequence[str], registry: SchemaSource | None) -> DecoderSpec:
        return DecoderSpec(self.name, self.field, self.options, {})

    def decode(self, raw: str, spec: DecoderSpec) -> str:
        return raw
