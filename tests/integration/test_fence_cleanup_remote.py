"""Issue 39, item 12: a committed batch's fence directory (``_kbp_fence_<N>/``) is removed on HDFS and
on object stores too, never a newer attempt's marker with it. Before, ``Location.remove_if_empty``
removed directories on local disks only, so on HDFS every batch left an empty directory behind.

**HDFS, real.** A real HDFS runs here: Hadoop's own ``MiniDFSCluster`` (a NameNode and a DataNode in
one JVM, ``hadoop-client-minicluster`` at pyspark's Hadoop version, fetched from Maven Central like
the project's other jars), started once for this module (~10-20 s). The product reaches HDFS through
pyarrow's ``HadoopFileSystem``, which cannot be loaded here: it needs ``libhdfs.so``, the JNI
library that ships only in Hadoop's binary distribution (neither Maven Central nor PyPI carries it,
and nothing else can be downloaded here). So the test wraps ``hdfs-native`` (a native HDFS client
from PyPI, speaking HDFS's RPC protocol to the NameNode) as a pyarrow filesystem
(``PyFileSystem(FSSpecHandler(...))``): the product's storage code makes the same pyarrow calls
(``get_file_info``, ``create_dir``, ``open_output_stream``, ``move``, ``delete_dir``) against a real
NameNode, with HDFS's own semantics (atomic rename, recursive-only deletes in pyarrow's API).

**Object stores, real.** SeaweedFS's S3 gateway (the session's ``s3_server``) with pyarrow's own
``S3FileSystem``, which leaves an empty directory marker object when a directory's last file goes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_kafka_backpressure.sinks.parquet.fencing import clear_fence, fence_markers, raise_fence
from airflow_kafka_backpressure.storage import Location
from kbp_local.process import free_ports

from .test_sink_fencing import race_clear_against_raise

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def hdfs_url() -> Iterator[str]:
    """``hdfs://127.0.0.1:<port>`` of a MiniDFSCluster (1 DataNode) for this module; its data under
    ``.tmp/``; stopped by its PID at the end."""
    from kbp_local.jars import bundle, jar_paths, pyspark_hadoop_version

    # MiniDFSCluster, run by MiniHadoopClusterManager, with the Hadoop client jars (~105 MB, cached)
    coordinates = f"org.apache.hadoop:hadoop-client-minicluster:{pyspark_hadoop_version()}"
    jars = jar_paths(bundle("hdfs-minicluster", [coordinates]))
    work = REPO / ".tmp" / f"hdfs-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    details = work / "details.json"
    port, http_port = free_ports(2)  # chosen together: distinct
    cmd = [
        "java",
        "-Xmx512m",
        f"-Djava.io.tmpdir={work}",
        "-cp",
        os.pathsep.join(jars),
        "org.apache.hadoop.mapreduce.MiniHadoopClusterManager",
        "-nomr",
        "-format",
        "-datanodes",
        "1",
        "-nnport",
        str(port),
        "-nnhttpport",
        str(http_port),
        "-writeDetails",
        str(details),
        "-D",
        f"hdfs.minidfs.basedir={work / 'dfs'}",
        "-D",
        "dfs.namenode.rpc-bind-host=127.0.0.1",
    ]
    log = open(work / "minicluster.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (details.exists() and details.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"MiniDFSCluster did not start (exit {proc.poll()}): "
                    + (work / "minicluster.log").read_text()[-3000:]
                )
            time.sleep(0.2)
        assert json.loads(details.read_text())["namenode_port"] == port
        yield f"hdfs://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def hdfs_sink(hdfs_url: str, request: pytest.FixtureRequest) -> Iterator[Location]:
    """A fresh sink directory on the HDFS, as the pyarrow filesystem the storage layer works on.

    The hdfs-native client is kept out of fsspec's instance cache and dropped here, in this process:
    it owns a tokio runtime whose worker threads exist only in the process that made it. fsspec
    clears its cache in every forked child (``os.register_at_fork``), and a cached client dropped
    there waits forever for threads the child does not have: the next ``subprocess.Popen`` with a
    ``preexec_fn`` (pyspark's JVM launch) then hung the test session, in CI, at the first Spark
    session started after this module."""
    from hdfs_native.fsspec import HdfsFileSystem
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    port = int(hdfs_url.rsplit(":", 1)[1])
    client = HdfsFileSystem(host="127.0.0.1", port=port, skip_instance_cache=True)
    path = f"/{request.node.name.replace('[', '_').replace(']', '')}/sink"
    sink = Location(PyFileSystem(FSSpecHandler(client)), path, hdfs_url + path)
    sink.mkdirs()
    yield sink
    assert not HdfsFileSystem._cache, "an hdfs-native client is left in fsspec's instance cache"
    # a fork that runs Python code in the child (as pyspark's launch does) still comes back
    subprocess.run(["true"], preexec_fn=lambda: None, timeout=60, check=True)  # noqa: PLW1509


def names(root: Location) -> list[str]:
    return [name for name, _, _ in root.children()]


def test_a_commit_removes_its_fence_directory_on_hdfs(hdfs_sink: Location):
    assert not hdfs_sink.fs.type_name.startswith("local")  # the path every non-local filesystem takes
    for batch_id in (1, 2, 3):
        assert raise_fence(hdfs_sink, batch_id, 1, "a" * 32) is None
        assert f"_kbp_fence_{batch_id}" in names(hdfs_sink)
        clear_fence(hdfs_sink, batch_id, 1)
    assert names(hdfs_sink) == []  # before: _kbp_fence_1, _kbp_fence_2, _kbp_fence_3 (empty)


def test_a_newer_attempts_marker_keeps_the_fence_on_hdfs(hdfs_sink: Location):
    assert raise_fence(hdfs_sink, 1, 3, "c" * 32) is None
    assert raise_fence(hdfs_sink, 1, 4, "d" * 32) is None
    clear_fence(hdfs_sink, 1, 3)
    assert fence_markers(hdfs_sink, 1) == {"d" * 32: 4}
    assert "attempt 4 started writing it" in raise_fence(hdfs_sink, 1, 3, "c" * 32)
    clear_fence(hdfs_sink, 1, 4)
    assert names(hdfs_sink) == []


def test_clearing_a_fence_never_loses_a_newer_marker_raised_meanwhile_on_hdfs(hdfs_sink: Location):
    """The race of ``test_sink_fencing``'s local-disk test, on HDFS: a commit's cleanup (attempt 1)
    against a newer attempt raising the fence (attempt 2), 60 times released together. The newer
    marker always survives, no call fails, and nothing is left beside the fences."""
    for batch_id in range(1, 61):
        race_clear_against_raise(hdfs_sink, batch_id)
        assert [n for n in names(hdfs_sink) if not n.startswith("_kbp_fence_")] == []  # nothing set aside
        assert names(hdfs_sink.child(f"_kbp_fence_{batch_id}")) == [f"{2:010d}_{'b' * 32}"]  # no temporary


def test_a_commit_removes_its_fence_directory_marker_on_s3(s3_server, s3_bucket):
    """pyarrow's S3 filesystem keeps an empty "directory" marker object when a directory's last file
    is deleted: the fence's prefix stayed listed as an empty directory, one per batch."""
    from pyarrow.fs import FileSelector, S3FileSystem

    fs = S3FileSystem(
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        endpoint_override=s3_server.endpoint.split("://", 1)[1],
        scheme="http",
    )
    sink = Location(fs, f"{s3_bucket}/sink", f"s3://{s3_bucket}/sink")
    sink.mkdirs()
    assert raise_fence(sink, 1, 1, "a" * 32) is None
    assert raise_fence(sink, 2, 1, "a" * 32) is None
    assert raise_fence(sink, 2, 2, "b" * 32) is None
    clear_fence(sink, 1, 1)
    clear_fence(sink, 2, 1)
    listed = sorted(i.path for i in fs.get_file_info(FileSelector(sink.path, recursive=True)))
    assert listed == [f"{s3_bucket}/sink/_kbp_fence_2", f"{s3_bucket}/sink/_kbp_fence_2/{2:010d}_{'b' * 32}"]
    clear_fence(sink, 2, 2)
    assert fs.get_file_info(FileSelector(sink.path, recursive=True, allow_not_found=True)) == []
