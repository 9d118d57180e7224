"""Sink formats: how a batch's rows become visible in the sink, once.

One small interface (:class:`~.base.SinkFormat`) and one registry (:data:`SINK_FORMATS`,
:func:`register`, :func:`sink_format_for`). A pipeline picks a format with ``sink_format``:
``parquet`` (the default, :mod:`.parquet`: a directory of Parquet directories, swapped in whole),
``delta`` (:mod:`.delta`: a Delta Lake table, one transaction per batch) or ``iceberg``
(:mod:`.iceberg`: an Iceberg table, one commit per batch through pyiceberg; like every
:class:`~.table.TableFormat`, it implements a DataFrame's commit and the read-back of a commit, and
gets the batch job's write and a replay's adoption from :mod:`.table`).

The pipelines file's validation and the reference's rows, the batch job (``spark/job.py``: adopt, or
read → transform → the format's commit), the plan task's sink checks, the ledger's commit lock
(:func:`~.commit_lock.commit_lock_name`), the Asset events and a downstream task's read of one batch
all read this registry and ask the format; nothing else names a format. Adding one is a module with
a :class:`~.base.SinkFormat` and a line here (or :func:`register`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import (
    BatchSource,
    BatchWrite,
    CommittedBatch,
    SetAside,
    SinkFenced,
    SinkFormat,
    SinkFormatError,
    UnknownSinkFormat,
)
from .commit_lock import commit_lock_name, normalized_sink_uri
from .delta import DeltaSink
from .iceberg import IcebergSink
from .parquet import ParquetSink
from .table import BatchCommit, TableFormat

#: Every sink format by name, the default first; validation, dispatch and the docs read this mapping.
SINK_FORMATS: dict[str, type[SinkFormat]] = {
    ParquetSink.name: ParquetSink,
    DeltaSink.name: DeltaSink,
    IcebergSink.name: IcebergSink,
}


def sink_format_names() -> tuple[str, ...]:
    """What a pipeline's ``sink_format`` may be: every registered format."""
    return tuple(SINK_FORMATS)


def register(fmt: type[SinkFormat]) -> type[SinkFormat]:
    """Add ``fmt`` to :data:`SINK_FORMATS` under its ``name``."""
    SINK_FORMATS[fmt.name] = fmt
    return fmt


def sink_format_for(name: str, options: Mapping[str, Any] | None = None) -> SinkFormat:
    """The sink format called ``name`` (one of :data:`SINK_FORMATS`), for the pipeline's
    ``options`` (its ``sink_options`` as job options; see :meth:`~.base.SinkFormat.configured`)."""
    try:
        fmt = SINK_FORMATS[name]
    except KeyError:
        raise UnknownSinkFormat(
            f"unknown sink format {name!r}: choose one of {', '.join(sorted(SINK_FORMATS))}"
        ) from None
    return fmt.configured(options or {})


__all__ = [
    "SINK_FORMATS",
    "BatchCommit",
    "BatchSource",
    "BatchWrite",
    "CommittedBatch",
    "DeltaSink",
    "IcebergSink",
    "ParquetSink",
    "SetAside",
    "SinkFenced",
    "SinkFormat",
    "SinkFormatError",
    "TableFormat",
    "UnknownSinkFormat",
    "commit_lock_name",
    "normalized_sink_uri",
    "register",
    "sink_format_for",
    "sink_format_names",
]
