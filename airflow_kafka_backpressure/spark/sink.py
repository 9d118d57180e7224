"""The idempotent sink: one Parquet directory per batch, replaced whole on every write.

Layout under the sink root (any Hadoop URI Spark understands: a local path, ``file://``,
``hdfs://``, ``s3a://`` …)::

    <sink>/batch_id=<N>/part-*.parquet        the batch's data (Hive-style partition directory)
    <sink>/batch_id=<N>/_manifest.json        what the batch holds (see below)
    <sink>/_kbp_staging_<N>_<uuid>/           a write in progress, or one a crash left behind
    <sink>/_kbp_replaced_<N>_<uuid>/          a previous version being removed

Names starting with ``_`` are skipped by Spark's and pyarrow's dataset readers (temporary names
contain no ``=``: Spark would take ``_x=y`` for a partition directory), so readers of the root see
each batch once or not at all.

:func:`write_batch` steps, and what a crash after each leaves:

1. delete this batch's ``_kbp_staging_<N>_*`` / ``_kbp_replaced_<N>_*`` leftovers;
2. write the DataFrame to a fresh staging directory — crash: a hidden leftover, removed by step 1
   of the next attempt;
3. write ``_manifest.json`` into the staging directory — same;
4. if ``batch_id=<N>`` exists, rename it to ``_kbp_replaced_<N>_<uuid>`` — crash: the batch is
   briefly absent (never duplicated); the failed job makes its task retry, which rewrites it;
5. rename staging to ``batch_id=<N>`` — the commit; crash after it: a hidden leftover;
6. delete the replaced version.

Re-running a batch therefore always converges to exactly one copy of its records. On HDFS and
local disks the renames are atomic. On object stores (s3a) a directory rename is a copy: a crash in
step 5 can leave a partial ``batch_id=<N>``; the manifest lists every data file with its size, so a
strict reader can verify a batch, and the retried write replaces it. One writer per batch at a time
(step 1 would remove a concurrent writer's staging directory): the ledger guarantees that.

An empty batch is still committed: Spark writes one schema-only Parquet file, plus the manifest.

Manifest fields: ``batch_id``, ``written_at_ms``, ``format``, ``files`` ([{name, bytes}]) and
whatever the caller's ``describe()`` returns (the job adds ranges, per-partition record counts,
total records and bytes).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from airflow_kafka_backpressure.models import batch_path

MANIFEST_NAME = "_manifest.json"
STAGING_PREFIX = "_kbp_staging_"
REPLACED_PREFIX = "_kbp_replaced_"
MANIFEST_VERSION = 1


class SinkError(RuntimeError):
    """The sink could not be written or committed."""


class HadoopFs:
    """The few Hadoop FileSystem calls the sink needs, through the Spark driver's JVM."""

    def __init__(self, spark: Any, uri: str) -> None:
        jvm = spark._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        conf = spark._jsc.hadoopConfiguration()
        path = self._Path(uri)
        self.fs = path.getFileSystem(conf)
        self.root = self.fs.makeQualified(path)

    def path(self, *parts: str) -> Any:
        p = self.root
        for part in parts:
            p = self._Path(p, part)
        return p

    def exists(self, p: Any) -> bool:
        return bool(self.fs.exists(p))

    def mkdirs(self, p: Any) -> None:
        if not self.fs.mkdirs(p):
            raise SinkError(f"cannot create directory {p.toString()}: check permissions")

    def delete(self, p: Any) -> None:
        if self.fs.exists(p) and not self.fs.delete(p, True):
            raise SinkError(f"cannot delete {p.toString()}: check permissions, then delete it by hand")

    def rename(self, src: Any, dst: Any) -> None:
        if not self.fs.rename(src, dst):
            raise SinkError(
                f"cannot rename {src.toString()} to {dst.toString()} (does the target exist, or is "
                "the parent missing?)"
            )

    def children(self, p: Any) -> list[tuple[str, bool, int]]:
        """(name, is_dir, length) of the entries directly under ``p``."""
        if not self.fs.exists(p):
            return []
        return [
            (st.getPath().getName(), bool(st.isDirectory()), int(st.getLen()))
            for st in self.fs.listStatus(p)
        ]

    def write_bytes(self, p: Any, data: bytes) -> None:
        out = self.fs.create(p, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def read_bytes(self, p: Any) -> bytes:
        stream = self.fs.open(p)
        try:
            return bytes(stream.readAllBytes())
        finally:
            stream.close()


def write_text(spark: Any, uri: str, text: str) -> None:
    """Write ``text`` to a Hadoop URI (a temporary name, then a rename over the target)."""
    fs = HadoopFs(spark, uri)
    tmp = fs._Path(fs.root.getParent(), f"_{fs.root.getName()}.{uuid.uuid4().hex}.tmp")
    fs.mkdirs(fs.root.getParent())
    fs.write_bytes(tmp, text.encode())
    fs.delete(fs.root)
    fs.rename(tmp, fs.root)


def _batch_dir_name(batch_id: int) -> str:
    return batch_path("", batch_id).lstrip("/")


def leftovers(spark: Any, sink: str, batch_id: int) -> list[str]:
    """Names of this batch's temporary directories under the sink root (from crashes or a
    running write)."""
    fs = HadoopFs(spark, sink)
    prefixes = (f"{STAGING_PREFIX}{int(batch_id)}_", f"{REPLACED_PREFIX}{int(batch_id)}_")
    return sorted(name for name, _, _ in fs.children(fs.root) if name.startswith(prefixes))


def write_batch(
    spark: Any,
    df: Any,
    sink: str,
    batch_id: int,
    describe: Callable[[], dict[str, Any]] | None = None,
    *,
    parquet_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write ``df`` as batch ``batch_id`` of ``sink``, replacing any previous version whole.

    ``describe`` is called after the data is written and before the commit; its dict goes into the
    manifest (the job counts records while writing, so the counts exist only then). Returns the
    manifest as committed.
    """
    fs = HadoopFs(spark, sink)
    fs.mkdirs(fs.root)
    for name in leftovers(spark, sink, batch_id):
        fs.delete(fs.path(name))

    token = uuid.uuid4().hex
    staging = fs.path(f"{STAGING_PREFIX}{int(batch_id)}_{token}")
    final = fs.path(_batch_dir_name(batch_id))
    try:
        writer = df.write.mode("errorifexists")
        for key, value in (parquet_options or {}).items():
            writer = writer.option(key, value)
        writer.parquet(staging.toString())

        files = [
            {"name": name, "bytes": size}
            for name, is_dir, size in sorted(fs.children(staging))
            if not is_dir and not name.startswith(("_", "."))
        ]
        manifest: dict[str, Any] = {"manifest_version": MANIFEST_VERSION, "batch_id": int(batch_id)}
        manifest.update(describe() if describe else {})
        manifest.update(format="parquet", files=files, written_at_ms=int(time.time() * 1000))
        fs.write_bytes(fs._Path(staging, MANIFEST_NAME), json.dumps(manifest, sort_keys=True).encode())
    except BaseException:
        try:  # a failed write leaves nothing behind; after a crash, step 1 of the next attempt cleans up
            fs.delete(staging)
        except Exception:
            pass
        raise

    replaced = None
    if fs.exists(final):
        replaced = fs.path(f"{REPLACED_PREFIX}{int(batch_id)}_{token}")
        fs.rename(final, replaced)
    try:
        fs.rename(staging, final)
    except SinkError:
        if replaced is not None and not fs.exists(final):
            fs.rename(replaced, final)  # put the previous version back; the retry replaces it
        raise
    if replaced is not None:
        fs.delete(replaced)
    return manifest


def read_manifest(spark: Any, sink: str, batch_id: int) -> dict[str, Any] | None:
    """The committed manifest of batch ``batch_id``, or None when the batch is not in the sink."""
    fs = HadoopFs(spark, sink)
    p = fs.path(_batch_dir_name(batch_id), MANIFEST_NAME)
    if not fs.exists(p):
        return None
    return json.loads(fs.read_bytes(p).decode())
