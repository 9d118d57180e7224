"""Files at a sink URI, through pyarrow's filesystems: the one storage layer of the product.

The sink (Parquet data, manifests), the submit engine's hand-off directory and the reader's
per-range completion records all go through these few functions, wherever they run: the Spark
driver, an executor's Python worker, the Airflow worker. Accepted locations:

* an absolute local path or ``file:///...``;
* ``s3://`` (``s3a://`` and ``s3n://``, Hadoop's names, are read as ``s3://``), ``gs://``/``gcs://``,
  ``hdfs://``, ``abfs://``/``abfss://`` — whatever ``pyarrow.fs.FileSystem.from_uri`` supports, with
  credentials from the environment where the code runs (pyarrow's default chains).

Relative paths are refused: the Spark driver, its executors and the Airflow worker would each
resolve them against a different directory.

Pure: pyarrow only (no Airflow, Spark or Kafka imports).
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

#: Hadoop scheme names that pyarrow knows under another name.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


class StorageError(RuntimeError):
    """A file operation at a sink location failed; the message names the location."""


def is_absolute_location(location: str) -> bool:
    """True for a URI with a scheme or an absolute local path (what a sink may be)."""
    if "://" in location:
        return True
    return os.path.isabs(location)


@dataclass(frozen=True)
class Location:
    """A directory or file on one filesystem: ``fs`` plus the path in it, and the URI it came from."""

    fs: Any
    path: str
    uri: str

    def child(self, *parts: str) -> Location:
        path = posixpath.join(self.path, *parts)
        uri = self.uri.rstrip("/") + "/" + "/".join(parts)
        return Location(self.fs, path, uri)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> Location:
        return Location(self.fs, posixpath.dirname(self.path.rstrip("/")), self.uri.rstrip("/").rsplit("/", 1)[0])

    # ----- queries ------------------------------------------------------------------------------
    def _info(self) -> Any:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def children(self) -> list[tuple[str, bool, int]]:
        """``(name, is_dir, size)`` of the entries directly under this directory (none if absent)."""
        from pyarrow.fs import FileSelector, FileType

        try:
            infos = self.fs.get_file_info(FileSelector(self.path, allow_not_found=True, recursive=False))
        except OSError as e:
            raise StorageError(f"cannot list {self.uri}: {e}") from e
        return sorted(
            (posixpath.basename(i.path), i.type == FileType.Directory, int(i.size or 0)) for i in infos
        )

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path) as f:
                return f.read()
        except FileNotFoundError as e:
            raise StorageError(f"{self.uri} does not exist") from e
        except OSError as e:
            raise StorageError(f"cannot read {self.uri}: {e}") from e

    # ----- changes ------------------------------------------------------------------------------
    def mkdirs(self) -> None:
        try:
            self.fs.create_dir(self.path, recursive=True)
        except OSError as e:
            raise StorageError(f"cannot create directory {self.uri}: {e}; check the path and permissions") from e

    def write_bytes(self, data: bytes, *, private: bool = False) -> None:
        """Write the whole file: a temporary name in the same directory, then a rename over the
        target (atomic on local disks and HDFS; object stores have no partial objects anyway).
        ``private``: owner-only permissions where the filesystem has them (local)."""
        tmp = self.parent.child(f".{self.name}.{uuid.uuid4().hex}.tmp")
        try:
            self.parent.mkdirs()
            if private and _is_local(self.fs):
                fd = os.open(tmp.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            else:
                with self.fs.open_output_stream(tmp.path) as f:
                    f.write(data)
            self.fs.move(tmp.path, self.path)
        except OSError as e:
            tmp.delete()
            raise StorageError(f"cannot write {self.uri}: {e}") from e

    def delete(self) -> None:
        """Delete this file or directory tree; nothing to do if it does not exist."""
        from pyarrow.fs import FileType

        try:
            kind = self._info().type
            if kind == FileType.Directory:
                self.fs.delete_dir(self.path)
            elif kind != FileType.NotFound:
                self.fs.delete_file(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot delete {self.uri}: {e}; delete it by hand") from e

    def move_to(self, target: Location) -> None:
        """Rename to ``target`` (which must not exist). Atomic for directories on local disks and
        HDFS; on object stores pyarrow copies."""
        try:
            self.fs.move(self.path, target.path)
        except OSError as e:
            raise StorageError(f"cannot rename {self.uri} to {target.uri}: {e}") from e


def _is_local(fs: Any) -> bool:
    from pyarrow.fs import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def location(uri: str) -> Location:
    """The :class:`Location` of ``uri`` (see the module doc for what is accepted)."""
    from pyarrow.fs import FileSystem, LocalFileSystem

    if not uri or not is_absolute_location(uri):
        raise StorageError(
            f"{uri!r} is not an absolute path or a URI: the Spark driver, the executors and the Airflow "
            "worker must all resolve it to the same place (e.g. /data/sink, s3://bucket/prefix)"
        )
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else uri
        return Location(LocalFileSystem(), os.path.normpath(path), uri)
    scheme = _SCHEME_ALIASES.get(parsed.scheme, parsed.scheme)
    native = scheme + uri[len(parsed.scheme) :]
    try:
        fs, path = FileSystem.from_uri(native)
    except (OSError, ValueError) as e:
        raise StorageError(
            f"cannot open {uri!r} with pyarrow's filesystems ({e}); supported: local paths, file://, "
            "s3:// (s3a://), gs://, hdfs://, abfs://"
        ) from e
    return Location(fs, path, uri)
