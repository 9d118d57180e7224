"""Bytecode for the Python sources in pyspark's ``python/lib/*.zip`` archives (tests and demo only).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the ``PYTHONPATH`` of
every Python process it starts: the driver of a spark-submit application, and each
``pyspark.daemon`` of a local session, an executor or a Connect server. Python's zipimport cannot
write bytecode into an archive, so each of those processes compiled pyspark's sources again: 1.3 to
1.9 s of CPU for ``import pyspark.sql`` (against the site-packages copy's cached bytecode, measured
on 2026-12-02), and 41% of the Python CPU of the spark-submit applications in the three-runs
pipeline test (py-spy).

:func:`add_bytecode` adds, beside each ``.py`` of such an archive, the ``.pyc`` that zipimport looks
for first (its legacy place, not ``__pycache__``), compiled by this interpreter in the unchecked-hash
form: zipimport uses it without comparing timestamps, and an interpreter of another version
ignores it (the magic number differs) and compiles the source as before. Nothing else in the
archive changes; the file is replaced whole.

    python -m kbp_local.pyspark_bytecode [SPARK_HOME]   # the archives of that (or this venv's) pyspark
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys
import tempfile
import zipfile
from pathlib import Path

#: an archive entry naming the interpreter whose bytecode the archive holds
MARKER = "kbp-bytecode.txt"


def _tag() -> str:
    return f"{sys.implementation.cache_tag} {importlib.util.MAGIC_NUMBER.hex()}\n"


def add_bytecode(archive: Path) -> bool:
    """Add this interpreter's bytecode to ``archive``; False when it already holds it."""
    with zipfile.ZipFile(archive) as zf:
        if MARKER in zf.namelist() and zf.read(MARKER).decode() == _tag():
            return False
        entries = [
            (info, zf.read(info))
            for info in zf.infolist()
            if not info.filename.endswith(".pyc") and info.filename != MARKER
        ]
    with tempfile.TemporaryDirectory(prefix="kbp-pyc-") as scratch:
        compiled: list[tuple[str, bytes]] = []
        for info, data in entries:
            if not info.filename.endswith(".py"):
                continue
            source = Path(scratch, "module.py")
            source.write_bytes(data)
            target = Path(scratch, "module.pyc")
            try:
                py_compile.compile(
                    str(source),
                    cfile=str(target),
                    # the name zipimport gives the module's code when it compiles the source itself
                    dfile=f"{archive}{os.sep}{info.filename}",
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
            except py_compile.PyCompileError:
                continue  # zipimport fails on it too, as before: nothing to add
            compiled.append((info.filename[: -len(".py")] + ".pyc", target.read_bytes()))
        fd, tmp = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.")
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                for info, data in entries:
                    out.writestr(info, data)
                for name, data in compiled:
                    out.writestr(name, data)
                out.writestr(MARKER, _tag())
            os.chmod(tmp, archive.stat().st_mode & 0o777)
            os.replace(tmp, archive)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return True


def archives(spark_home: Path) -> list[Path]:
    """pyspark's and py4j's archives under ``spark_home/python/lib``."""
    return sorted((spark_home / "python" / "lib").glob("*.zip"))


def main(argv: list[str]) -> int:
    if argv:
        home = Path(argv[0])
    else:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            print("pyspark_bytecode: pyspark is not installed here; name its SPARK_HOME", file=sys.stderr)
            return 2
        home = Path(spec.origin).parent
    found = archives(home)
    if not found:
        print(f"pyspark_bytecode: no archive under {home / 'python' / 'lib'}", file=sys.stderr)
        return 2
    for archive in found:
        added = add_bytecode(archive)
        print(f"pyspark_bytecode: {archive}: {'bytecode added' if added else 'holds bytecode already'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
