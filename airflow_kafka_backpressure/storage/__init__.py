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

import errno
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

#: Hadoop scheme names that pyarrow knows under another name.
SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
#: Reads of a directory whose entries change while it is listed (see :meth:`Location.children`).
LIST_TRIES = 5
#: The name ending of :meth:`Location.write_bytes`'s temporary files (renamed over the target).
TEMPORARY_SUFFIX = ".tmp"
#: pyarrow filesystems whose directories are key prefixes (``FileSystem.type_name``).
OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})


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
        return Location(
            self.fs, posixpath.dirname(self.path.rstrip("/")), self.uri.rstrip("/").rsplit("/", 1)[0]
        )

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

        selector = FileSelector(self.path, allow_not_found=True, recursive=False)
        for tries_left in reversed(range(LIST_TRIES)):
            try:
                infos = self.fs.get_file_info(selector)
                break
            except FileNotFoundError as e:
                # an entry went between the directory's read and its stat (another writer's temporary
                # file renamed into place, as write_bytes does): the listing is read again
                if not tries_left:
                    raise StorageError(f"cannot list {self.uri}: {e}") from e
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
        """Create the directory and its parents (nothing if it exists). A directory that a
        concurrent cleanup (:meth:`remove_if_empty`) removes while this runs is created again:
        Arrow's local create finds it present (``EEXIST``), then gone when it checks that it is a
        directory, and reports "non-directory entry exists" (seen racing a commit's fence cleanup
        against a newer attempt's fence marker: about 1 race in 3,000 on 2 cores)."""
        for tries_left in reversed(range(LIST_TRIES)):
            try:
                self.fs.create_dir(self.path, recursive=True)
                return
            except OSError as e:
                if tries_left and isinstance(e, FileExistsError) and not self.exists():
                    continue  # removed between the create and its check: create it again
                raise StorageError(
                    f"cannot create directory {self.uri}: {e}; check the path and permissions"
                ) from e

    def write_bytes(self, data: bytes, *, private: bool = False) -> None:
        """Write the whole file: a temporary name in the same directory, then a rename over the
        target (atomic on local disks and HDFS; object stores have no partial objects anyway).
        ``private``: owner-only permissions where the filesystem has them (local)."""
        tmp = self.parent.child(f".{self.name}.{uuid.uuid4().hex}{TEMPORARY_SUFFIX}")
        try:
            for tries_left in reversed(range(LIST_TRIES)):
                self.parent.mkdirs()
                try:
                    if private and _is_local(self.fs):
                        fd = os.open(tmp.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                        with os.fdopen(fd, "wb") as f:
                            f.write(data)
                    else:
                        with self.fs.open_output_stream(tmp.path) as f:
                            f.write(data)
                    self.fs.move(tmp.path, self.path)
                    break
                except FileNotFoundError:
                    # the directory went between its creation and the rename: an empty directory
                    # removed by a concurrent cleanup (remove_if_empty; elsewhere than on a local
                    # disk it is set aside with this temporary file in it): write it again
                    if not tries_left:
                        raise
                    tmp.delete()
                    tmp = self.parent.child(f".{self.name}.{uuid.uuid4().hex}{TEMPORARY_SUFFIX}")
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

    def remove_if_empty(self) -> bool:
        """Remove this directory if it is empty, never an entry another writer adds meanwhile. True
        if the directory is gone (or was absent), False if something is in it.

        * **Local disks**: ``rmdir``, atomic: an entry created meanwhile keeps the directory.
        * **Object stores** (S3, GCS, Azure): a directory is a prefix; what is left once its last
          object is deleted is at most an empty "directory" marker object (pyarrow writes one for
          ``create_dir`` and when it deletes a directory's last file). With no object under the
          prefix, the marker is deleted. There is no conditional delete: an object written within
          the milliseconds between the check and the delete goes too (the sink's fences, the one
          caller, are not used on object stores: Parquet sinks there are refused at plan time).
        * **HDFS and every other filesystem** (pyarrow deletes directories only recursively there):
          the directory is renamed aside to a unique name (an atomic rename on HDFS), then the
          renamed one is deleted if empty. An entry that arrived between the check and the rename is
          moved back (a writer's temporary file is deleted instead: :meth:`write_bytes` writes it
          again when its rename finds it gone); for those milliseconds it is not at its path."""
        if _is_local(self.fs):
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return False
                raise StorageError(f"cannot remove directory {self.uri}: {e}") from e
        if self.children():
            return False
        if not self.exists():
            return True
        if _is_object_store(self.fs):
            self.delete()  # only its marker: nothing is under the prefix
            return True
        return self._remove_aside_if_empty()

    def _remove_aside_if_empty(self) -> bool:
        aside = self.parent.child(f".{self.name}.{uuid.uuid4().hex}.removing")
        try:
            self.fs.move(self.path, aside.path)
        except FileNotFoundError:
            return True  # removed meanwhile (another cleanup)
        except OSError as e:
            raise StorageError(f"cannot remove directory {self.uri}: {e}") from e
        kept = False
        for name, _, _ in aside.children():  # arrived between the check and the rename
            if name.startswith(".") and name.endswith(TEMPORARY_SUFFIX):
                aside.child(name).delete()  # its writer writes it again (write_bytes)
                continue
            self.mkdirs()
            aside.child(name).move_to(self.child(name))
            kept = True
        aside.delete()  # empty now, and no other writer knows its name
        return not kept

    def move_to(self, target: Location) -> None:
        """Rename to ``target`` (which must not exist). Atomic for directories on local disks and
        HDFS. On S3 pyarrow moves a file as a copy and a delete, and cannot move a directory (it
        sends one ``CopyObject`` of the directory's own key: ``NO_SUCH_KEY``, nothing changed —
        ``tests/integration/test_s3_server.py``)."""
        try:
            self.fs.move(self.path, target.path)
        except OSError as e:
            raise StorageError(f"cannot rename {self.uri} to {target.uri}: {e}") from e

    def exchange_with(self, target: Location) -> bool:
        """Swap this directory and ``target`` (both exist) in one atomic step, so that a reader sees
        either the old or the new ``target``, never neither nor both. Local filesystems on Linux:
        ``renameat2(RENAME_EXCHANGE)``. Returns False — nothing changed — where no atomic exchange
        exists (object stores, HDFS, other systems, filesystems without it): the caller falls back
        to two renames."""
        if not _is_local(self.fs):
            return False
        try:
            return rename_exchange(self.path, target.path)
        except OSError as e:
            raise StorageError(f"cannot exchange {self.uri} and {target.uri}: {e}") from e

    def move_no_replace(self, target: Location) -> bool:
        """Rename to ``target`` only if ``target`` does not exist (atomic test-and-rename, local
        Linux filesystems: ``renameat2(RENAME_NOREPLACE)``). Returns False if ``target`` appeared
        meanwhile. Elsewhere: an existence check and a rename (a race is possible there)."""
        if _is_local(self.fs):
            try:
                done = _renameat2(self.path, target.path, RENAME_NOREPLACE)
            except FileExistsError:
                return False
            except OSError as e:
                raise StorageError(f"cannot rename {self.uri} to {target.uri}: {e}") from e
            if done:
                return True
        if target.exists():
            return False
        self.move_to(target)
        return True


#: flags of Linux renameat2(2)
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc: Any = None


def _renameat2(old: str, new: str, flags: int) -> bool:
    """``renameat2(AT_FDCWD, old, AT_FDCWD, new, flags)`` through ctypes. True when done; False when
    the system has no renameat2 (not Linux, old glibc) or the filesystem does not support ``flags``
    (EINVAL/ENOSYS/ENOTSUP); other errors raise OSError."""
    global _libc
    import ctypes
    import ctypes.util
    import errno
    import sys

    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(old), _AT_FDCWD, os.fsencode(new), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), old)


def rename_exchange(a: str, b: str) -> bool:
    """Atomically exchange the local paths ``a`` and ``b`` (both must exist); False if unsupported."""
    return _renameat2(a, b, RENAME_EXCHANGE)


def _is_local(fs: Any) -> bool:
    from pyarrow.fs import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _is_object_store(fs: Any) -> bool:
    return str(getattr(fs, "type_name", "")) in OBJECT_STORES


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
    scheme = SCHEME_ALIASES.get(parsed.scheme, parsed.scheme)
    native = scheme + uri[len(parsed.scheme) :]
    try:
        fs, path = FileSystem.from_uri(native)
    except (OSError, ValueError) as e:
        raise StorageError(
            f"cannot open {uri!r} with pyarrow's filesystems ({e}); supported: local paths, file://, "
            "s3:// (s3a://), gs://, hdfs://, abfs://"
        ) from e
    return Location(fs, path, uri)
