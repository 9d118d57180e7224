"""kbp_local.pyspark_bytecode: an archive on the path imports its modules from the bytecode added
beside their sources, the sources stay, and a second pass changes nothing."""

import subprocess
import sys
import textwrap
import zipfile

from kbp_local.pyspark_bytecode import MARKER, add_bytecode


def _archive(path):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/__init__.py", "VALUE = 41\n")
        zf.writestr("pkg/mod.py", "from pkg import VALUE\n\ndef answer():\n    return VALUE + 1\n")
        zf.writestr("pkg/data.txt", "kept as it is\n")
        zf.writestr("pkg/broken.py", "def (:\n")  # zipimport cannot compile it either
    return path


def _import(archive) -> str:
    """What a fresh interpreter with ``archive`` first on its path imports from it."""
    code = textwrap.dedent(
        """
        import pkg.mod
        print(pkg.__file__.rsplit("/", 1)[-1], pkg.mod.__file__.rsplit("/", 1)[-1], pkg.mod.answer())
        import inspect
        print(inspect.getsource(pkg.mod.answer).splitlines()[0])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(archive), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_the_archive_imports_from_the_added_bytecode_and_keeps_its_sources(tmp_path):
    archive = _archive(tmp_path / "lib.zip")
    assert _import(archive).splitlines()[0] == "__init__.py mod.py 42"  # compiled from source

    assert add_bytecode(archive) is True
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        assert {"pkg/__init__.py", "pkg/mod.py", "pkg/broken.py", "pkg/data.txt"} <= names
        assert {"pkg/__init__.pyc", "pkg/mod.pyc", MARKER} <= names
        assert "pkg/broken.pyc" not in names
        assert zf.read("pkg/data.txt") == b"kept as it is\n"
    first, source_line = _import(archive).splitlines()
    assert first == "__init__.pyc mod.pyc 42"
    assert source_line == "def answer():"  # tracebacks and inspect still find the source


def test_a_second_pass_changes_nothing(tmp_path):
    archive = _archive(tmp_path / "lib.zip")
    assert add_bytecode(archive) is True
    before = archive.read_bytes()
    assert add_bytecode(archive) is False
    assert archive.read_bytes() == before


def test_bytecode_of_another_interpreter_is_replaced(tmp_path):
    archive = _archive(tmp_path / "lib.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(MARKER, "cpython-00 deadbeef\n")
        zf.writestr("pkg/mod.pyc", b"not bytecode of this interpreter")
    assert add_bytecode(archive) is True
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist().count("pkg/mod.pyc") == 1
        assert zf.namelist().count(MARKER) == 1
    assert _import(archive).splitlines()[0] == "__init__.pyc mod.pyc 42"
