"""The ledger lock that serializes the batches' jobs into one table, for the sink formats and
stores whose commit is not safe among concurrent Spark drivers
(:meth:`~.base.SinkFormat.commit_lock_reason`: Delta on S3 with its default LogStore), and for
every table with a maintenance DAG (the maintenance holds it while it compacts and expires, so
that it never commits beside a batch).

One lock per table, named by the sink's normalized URI, so that every task that writes the table
through the pipeline's ledger (ingest, replay, a cleared run; other pipelines sharing the ledger)
takes the same one, however the path is spelled (``s3a://B/t/`` and ``s3://B/t`` are one table).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from urllib.parse import urlsplit

#: S3's URI schemes, one object store: a table is the same whichever names it
_S3_SCHEMES = {"s3", "s3a", "s3n"}


def normalized_sink_uri(sink: str) -> str:
    """``sink`` as one spelling per location: the scheme in lower case (``s3a``/``s3n`` as ``s3``),
    the host as given but in lower case, the path without ``.``, ``..``, repeated or trailing
    slashes; a local path absolute, as ``file://<path>``."""
    text = sink.strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if len(scheme) <= 1:  # a local path (or a Windows drive letter)
        return "file://" + os.path.normpath(os.path.abspath(text))
    scheme = "s3" if scheme in _S3_SCHEMES else scheme
    path = parts.path
    if path:
        path = "/" + posixpath.normpath(path).lstrip("/")
        path = "" if path == "/" else path
    return f"{scheme}://{parts.netloc.lower()}{path}"


def commit_lock_name(
    sink_format: str, sink: str, spark_conf: Mapping[str, str], *, maintained: bool = False
) -> str | None:
    """The name of the ledger lock a batch's job into ``sink`` must hold, or None when the format's
    commits into it are safe among concurrent drivers (the Parquet directory's: its commit is its
    own swap) and the table has no maintenance (``maintained``: the pipeline's maintenance DAG
    holds the lock while it compacts), or the format is not registered here."""
    from . import SINK_FORMATS

    fmt = SINK_FORMATS.get(sink_format)
    if fmt is None:
        return None
    if not (maintained and fmt.maintainable) and fmt().commit_lock_reason(sink, spark_conf) is None:
        return None
    return f"sink-commit:{normalized_sink_uri(sink)}"
