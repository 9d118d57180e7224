"""Sink formats: how a batch's rows become visible in the sink, once.

One small interface (:class:`~.base.SinkFormat`) and one registry (:data:`SINK_FORMATS`,
:func:`sink_format_for`). A format writes a batch's DataFrame as one commit that retries, replays and
cleared runs cannot duplicate or skip, says whether a batch is committed, reads back what a
batch committed (its batch id, attempt, ranges and record count) for adoption and the ledger, and
says whether its commits into a sink must be serialized across Spark drivers
(:func:`~.commit_lock.commit_lock_name`: the ledger's lock of the table).

A pipeline picks one with ``sink_format``: ``parquet`` (the default) is the Parquet directory of
``spark/sink.py`` (its own staging, manifest, fence and swap: not behind this interface yet), and
every name of :data:`SINK_FORMATS` (``delta``) runs through ``spark/table_job.py``.
"""

from __future__ import annotations

from .base import BatchCommit, SinkFenced, SinkFormat, SinkFormatError, UnknownSinkFormat
from .commit_lock import commit_lock_name, normalized_sink_uri
from .delta import DeltaSink

#: Every sink format by name; validation, dispatch and the docs read this one mapping.
SINK_FORMATS: dict[str, type[SinkFormat]] = {DeltaSink.name: DeltaSink}
#: The ``sink_format`` a pipeline may name: the Parquet directory, then every table format.
SINK_FORMAT_NAMES: tuple[str, ...] = ("parquet", *SINK_FORMATS)


def sink_format_for(name: str) -> SinkFormat:
    """The sink format called ``name`` (one of :data:`SINK_FORMATS`)."""
    try:
        return SINK_FORMATS[name]()
    except KeyError:
        raise UnknownSinkFormat(
            f"unknown sink format {name!r}: choose one of {', '.join(sorted(SINK_FORMATS))}"
        ) from None


__all__ = [
    "SINK_FORMATS",
    "SINK_FORMAT_NAMES",
    "BatchCommit",
    "DeltaSink",
    "SinkFenced",
    "SinkFormat",
    "SinkFormatError",
    "UnknownSinkFormat",
    "commit_lock_name",
    "normalized_sink_uri",
    "sink_format_for",
]
