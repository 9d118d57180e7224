"""The error of a Kafka connection's properties (shared by :mod:`.config` and :mod:`.credentials`)."""

from __future__ import annotations


class KafkaConfigError(ValueError):
    """A Kafka connection's property is unknown, missing or invalid; the message names it and the fix."""
