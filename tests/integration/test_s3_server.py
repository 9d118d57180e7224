"""A real S3-compatible object store for the sink's tests: SeaweedFS's S3 gateway
(:class:`~kbp_local.s3.S3Server`), reached the way users configure it —
pyarrow's ``S3FileSystem``, the ``AWS_*`` environment of pyarrow's ``s3://`` URIs, Spark's ``s3a://``
with hadoop-aws from Maven Central — and what today's sink does there.

Facts recorded here for the sink's commit protocol on object stores:

* pyarrow's ``fs.move`` of a *directory* fails on S3 (a ``CopyObject`` of the directory's own key,
  which does not exist) and changes nothing: today's commit (``_swap_in``) cannot publish a batch;
* moving a *file* works, as a copy and a delete;
* SeaweedFS honours ``If-None-Match: *`` and ``If-Match`` on ``PutObject``, atomically among
  concurrent writers (a fence can be a conditional write), ``If-None-Match: *`` on ``CopyObject``
  and ``If-Match`` on ``DeleteObject``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from kbp_local.jars import hadoop_aws_jars, jar_paths, spark_s3a_conf
from kbp_local.process import free_port
from tests.s3_requests import signed_request

pytestmark = pytest.mark.integration

APP = str(Path(__file__).with_name("s3a_roundtrip_app.py"))


def _listing(s3: pafs.FileSystem, path: str) -> dict[str, str]:
    infos = s3.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return {i.path[len(path) + 1 :]: i.type.name for i in infos}


def _request(server, method: str, bucket: str, key: str = "", body: bytes = b"", headers=None):
    return signed_request(
        server.endpoint,
        server.access_key,
        server.secret_key,
        server.region,
        method,
        bucket,
        key,
        body,
        headers,
    )


def _listening_addresses(pid: int) -> list[str]:
    """``ip:port`` of every TCP socket in LISTEN state that process ``pid`` holds (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                addr, port = cols[1].split(":")
                if width == 8:
                    ip = ".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    ip = "ipv6:" + addr
                found.append(f"{ip}:{int(port, 16)}")
    return sorted(found)


# --------------------------------------------------------------------------- the server


def test_the_server_listens_on_loopback_only_on_the_ports_it_was_given(s3_server):
    addresses = _listening_addresses(s3_server.pid)
    expected = sorted(f"127.0.0.1:{p}" for p in [s3_server.port, *s3_server.ports.values()])
    assert addresses == expected


def test_the_server_logs_into_its_work_dir_only(s3_server):
    """SeaweedFS's logger writes files named ``weed.<host>.<user>.log.<LEVEL>.<time>.<pid>`` into the
    temporary directory unless told to log to stderr (which goes to the work dir's log)."""
    pid = str(s3_server.pid)
    for tmp in {tempfile.gettempdir(), "/tmp"}:
        assert not [f for f in os.listdir(tmp) if f.startswith("weed.") and f.endswith("." + pid)]
    assert "Start Seaweed" in s3_server.log_path.read_text()


def test_a_server_that_cannot_start_says_so_and_leaves_nothing_running(tmp_path):
    from kbp_local.s3 import S3Server, S3ServerError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = S3Server(tmp_path / "s3", port=taken.getsockname()[1])
        with pytest.raises(S3ServerError, match=r"SeaweedFS exited with code \d+ while starting"):
            server.start(timeout_s=60)
    assert server.process is None
    assert "address already in use" in (tmp_path / "s3" / "seaweedfs.log").read_text()
    grpc_ports = {str(p) for name, p in server.ports.items() if name.endswith(".grpc")}
    assert not [
        f for f in os.listdir("/tmp") if f.startswith("seaweedfs-") and f.split("-")[-1][:-5] in grpc_ports
    ]


def test_only_signed_requests_of_the_configured_identity_are_served(s3_server, s3_bucket):
    s3_server.filesystem().open_output_stream(f"{s3_bucket}/k").close()
    assert _request(s3_server, "GET", s3_bucket, "k").status == 200
    wrong = signed_request(
        s3_server.endpoint, s3_server.access_key, "not-the-secret", s3_server.region, "GET", s3_bucket, "k"
    )
    assert wrong.status == 403 and b"SignatureDoesNotMatch" in wrong.body
    with pytest.raises(OSError, match="ACCESS_DENIED during HeadObject"):
        s3_server.filesystem(secret_key="not-the-secret").get_file_info(f"{s3_bucket}/k")
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{s3_server.endpoint}/{s3_bucket}/k", timeout=30)
    assert anonymous.value.code == 403


# --------------------------------------------------------------------------- pyarrow


def test_pyarrow_writes_and_reads_parquet_through_s3_filesystem(s3_server, s3_bucket):
    s3 = s3_server.filesystem()
    parts = [
        pa.table({"id": list(range(i * 500, (i + 1) * 500)), "name": [f"row-{j}" for j in range(500)]})
        for i in range(2)
    ]
    for i, part in enumerate(parts):
        pq.write_table(part, f"{s3_bucket}/table/part-{i}.parquet", filesystem=s3)

    assert sorted(_listing(s3, f"{s3_bucket}/table")) == ["part-0.parquet", "part-1.parquet"]
    back = pq.read_table(f"{s3_bucket}/table", filesystem=s3).sort_by("id")
    assert back.equals(pa.concat_tables(parts))
    # the bytes are on the server, not in a client cache: a raw GET returns the same Parquet file
    raw = _request(s3_server, "GET", s3_bucket, "table/part-1.parquet")
    assert raw.status == 200 and raw.body[:4] == raw.body[-4:] == b"PAR1"
    assert len(raw.body) == s3.get_file_info(f"{s3_bucket}/table/part-1.parquet").size


def test_s3_uris_reach_the_server_through_the_aws_environment(s3_server, s3_bucket, monkeypatch):
    """The sink's storage layer opens ``s3://`` URIs with ``FileSystem.from_uri``, configured by the
    environment where it runs: the server's :meth:`aws_environment` is what a user exports."""
    from airflow_kafka_backpressure.storage import location

    for key, value in s3_server.aws_environment().items():
        monkeypatch.setenv(key, value)
    loc = location(f"s3a://{s3_bucket}/env/manifest.json")
    loc.write_bytes(b'{"rows": 3}')  # a temporary name, then a file move
    assert loc.read_bytes() == b'{"rows": 3}'
    assert _request(s3_server, "GET", s3_bucket, "env/manifest.json").body == b'{"rows": 3}'
    assert [name for name, _, _ in loc.parent.children()] == ["manifest.json"]


# --------------------------------------------------------------------------- today's publish step on S3


def test_fs_move_of_a_directory_fails_on_s3_and_changes_nothing(s3_server, s3_bucket):
    """What today's sink publishes a batch with (``storage.Location.move_to`` → ``fs.move``):
    Arrow's S3 filesystem sends one ``CopyObject`` of the directory's key — no such object exists
    — and does not copy the files one by one. A file moves (copy, then delete)."""
    s3 = s3_server.filesystem()
    staging, final = f"{s3_bucket}/sink/_kbp_staging_1_t", f"{s3_bucket}/sink/batch_id=1"
    s3.create_dir(staging)
    for i in range(2):
        pq.write_table(pa.table({"id": [i]}), f"{staging}/part-{i}.parquet", filesystem=s3)
    before = _listing(s3, f"{s3_bucket}/sink")

    with pytest.raises(
        OSError,
        match=r"When copying key 'sink/_kbp_staging_1_t' in bucket '.*' to key 'sink/batch_id=1'.*NO_SUCH_KEY during CopyObject",
    ):
        s3.move(staging, final)
    assert _listing(s3, f"{s3_bucket}/sink") == before
    assert s3.get_file_info(final).type == pafs.FileType.NotFound

    s3.move(f"{staging}/part-0.parquet", f"{s3_bucket}/sink/moved.parquet")
    assert s3.get_file_info(f"{staging}/part-0.parquet").type == pafs.FileType.NotFound
    assert pq.read_table(f"{s3_bucket}/sink/moved.parquet", filesystem=s3).column("id").to_pylist() == [0]


def test_todays_commit_of_a_batch_to_s3_fails_at_the_swap(s3_server, s3_bucket, monkeypatch):
    """``sinks.parquet.commit.commit_batch`` on an ``s3://`` sink, with a staging directory as Spark's
    writer leaves it: the manifest is written, then the swap's directory rename fails — the batch
    is never published and the staging directory stays behind (with the manifest)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from airflow_kafka_backpressure.batch.models import OffsetRange
    from airflow_kafka_backpressure.sinks.parquet.commit import (
        SinkError,
        batch_dir_name,
        commit_batch,
        staging_dir_name,
    )

    for key, value in s3_server.aws_environment().items():
        monkeypatch.setenv(key, value)
    s3 = s3_server.filesystem()
    sink, token = f"s3://{s3_bucket}/sink", uuid.uuid4().hex
    staging = f"{s3_bucket}/sink/{staging_dir_name(1, token)}"
    pq.write_table(pa.table({"id": [0, 1, 2]}), f"{staging}/part-00000.parquet", filesystem=s3)
    s3.open_output_stream(f"{staging}/_SUCCESS").close()
    rng = OffsetRange("events", 0, 0, 3)

    with pytest.raises(
        SinkError, match=r"batch 1: cannot commit to sink .*cannot rename .*NO_SUCH_KEY during CopyObject"
    ):
        commit_batch(
            sink,
            1,
            token,
            [rng],
            {"pipeline": "p"},
            StructType([StructField("id", LongType())]),
            reads=[(rng, 3, 30)],
        )
    assert s3.get_file_info(f"{s3_bucket}/sink/{batch_dir_name(1)}").type == pafs.FileType.NotFound
    assert _listing(s3, staging) == {"part-00000.parquet": "File", "_manifest.json": "File"}
    manifest = json.loads(
        _request(s3_server, "GET", s3_bucket, f"sink/{staging_dir_name(1, token)}/_manifest.json").body
    )
    assert (manifest["rows"], manifest["records"]) == (3, 3)


# --------------------------------------------------------------------------- conditional writes


def test_conditional_puts_are_honoured_and_atomic_among_concurrent_writers(s3_server, s3_bucket):
    """``If-None-Match: *`` (create only) and ``If-Match: <etag>`` (replace only that version) on
    PutObject — what an atomic fence needs; among 8 concurrent writers exactly one wins each."""
    key = "sink/_kbp_fence_1.json"
    created = _request(s3_server, "PUT", s3_bucket, key, b'{"attempt": 1}', {"If-None-Match": "*"})
    assert created.status == 200 and created.etag
    again = _request(s3_server, "PUT", s3_bucket, key, b'{"attempt": 2}', {"If-None-Match": "*"})
    assert again.status == 412 and b"PreconditionFailed" in again.body
    assert _request(s3_server, "PUT", s3_bucket, key, b'{"attempt": 2}', {"If-Match": '"0000"'}).status == 412
    swapped = _request(s3_server, "PUT", s3_bucket, key, b'{"attempt": 2}', {"If-Match": created.etag})
    assert swapped.status == 200 and swapped.etag != created.etag
    assert (
        _request(s3_server, "PUT", s3_bucket, key, b'{"attempt": 3}', {"If-Match": created.etag}).status
        == 412
    )
    assert _request(s3_server, "GET", s3_bucket, key).body == b'{"attempt": 2}'

    def race(headers, body_prefix: str, race_key: str) -> list[tuple[int, int]]:
        results: list[tuple[int, int]] = []
        start = threading.Barrier(8)

        def put(i: int) -> None:
            start.wait(timeout=30)
            r = _request(s3_server, "PUT", s3_bucket, race_key, f"{body_prefix}{i}".encode(), headers)
            results.append((r.status, i))

        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        return sorted(results)

    creates = race({"If-None-Match": "*"}, "create-", "race/fence")
    assert [s for s, _ in creates].count(200) == 1 and [s for s, _ in creates].count(412) == 7
    winner = next(i for s, i in creates if s == 200)
    current = _request(s3_server, "GET", s3_bucket, "race/fence")
    assert current.body == f"create-{winner}".encode()
    swaps = race({"If-Match": current.etag}, "swap-", "race/fence")
    assert [s for s, _ in swaps].count(200) == 1 and [s for s, _ in swaps].count(412) == 7
    winner = next(i for s, i in swaps if s == 200)
    assert _request(s3_server, "GET", s3_bucket, "race/fence").body == f"swap-{winner}".encode()


def test_conditional_copy_and_delete_are_honoured(s3_server, s3_bucket):
    """A server-side copy that must not overwrite (``If-None-Match: *`` on CopyObject), and a
    delete of one version only (``If-Match`` on DeleteObject)."""
    src = _request(s3_server, "PUT", s3_bucket, "staging/part-0", b"new")
    _request(s3_server, "PUT", s3_bucket, "final/part-0", b"old")
    copy = {"x-amz-copy-source": f"/{s3_bucket}/staging/part-0", "If-None-Match": "*"}
    assert _request(s3_server, "PUT", s3_bucket, "final/part-0", headers=copy).status == 412
    assert _request(s3_server, "GET", s3_bucket, "final/part-0").body == b"old"
    assert _request(s3_server, "PUT", s3_bucket, "final/part-1", headers=copy).status == 200
    assert _request(s3_server, "GET", s3_bucket, "final/part-1").body == b"new"

    assert (
        _request(s3_server, "DELETE", s3_bucket, "staging/part-0", headers={"If-Match": '"0000"'}).status
        == 412
    )
    assert _request(s3_server, "GET", s3_bucket, "staging/part-0").status == 200
    assert (
        _request(s3_server, "DELETE", s3_bucket, "staging/part-0", headers={"If-Match": src.etag}).status
        == 204
    )
    assert _request(s3_server, "GET", s3_bucket, "staging/part-0").status == 404


# --------------------------------------------------------------------------- Spark's s3a


def test_hadoop_aws_matches_pyspark_and_leaves_out_what_pyspark_ships():
    from kbp_local.jars import pyspark_hadoop_version, pyspark_jars_dir

    names = sorted(os.path.basename(p) for p in jar_paths(hadoop_aws_jars()))
    version = pyspark_hadoop_version()
    assert (pyspark_jars_dir() / f"hadoop-client-api-{version}.jar").exists()
    assert f"hadoop-aws-{version}.jar" in names
    assert [n for n in names if re.fullmatch(r"bundle-2\.\d+\.\d+\.jar", n)], names  # the AWS SDK v2
    assert not [n for n in names if n.startswith(("hadoop-client", "scala-", "slf4j", "jackson"))], names


# extraClassPath only in the suite: with spark.jars each local-mode application copies the 659 MB
# bundle into its scratch directory (both ways were checked when spark_s3a_conf was written)
@pytest.mark.parametrize("jars", ["extraClassPath"])
def test_spark_writes_and_reads_parquet_through_s3a(spark_submit, s3_server, s3_bucket, jars):
    """Spark's own Parquet writer and reader on ``s3a://`` (local[2], a fresh spark-submit with
    hadoop-aws and the s3a settings of :func:`spark_s3a_conf`); pyarrow reads the same files."""
    path = f"s3a://{s3_bucket}/spark/out"
    result = spark_submit(APP, path, "1000", conf=spark_s3a_conf(s3_server, jars=jars))
    assert result.returncode == 0, result.stderr[-5000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("{")]
    out = json.loads(line)
    assert out["fs"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert (out["rows"], out["distinct_ids"], out["id_sum"]) == (1000, 1000, sum(range(1000)))
    parts = sorted(n for n in out["files"] if n.endswith(".parquet"))
    assert len(parts) == 3 and "_SUCCESS" in out["files"]

    s3 = s3_server.filesystem()
    listed = _listing(s3, f"{s3_bucket}/spark/out")
    assert sorted(n for n in listed if n.endswith(".parquet")) == parts
    ids = pq.read_table(f"{s3_bucket}/spark/out", filesystem=s3, columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(1000))


# --------------------------------------------------------------------------- command line


def test_s3_command_line_serves_until_interrupted(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbp_local",
            "s3",
            "--port",
            str(port),
            "--work-dir",
            str(tmp_path / "s3"),
            "--bucket",
            "cli-demo",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(6)]  # the address, then 5 AWS_* variables
        m = re.search(rf"listening on http://127\.0\.0\.1:{port}, pid (\d+)", lines[0])
        assert m, lines
        creds = dict(re.findall(r"(AWS_[A-Z_]+)=(\S+)", "".join(lines)))
        assert creds["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        put = signed_request(
            creds["AWS_ENDPOINT_URL"],
            creds["AWS_ACCESS_KEY_ID"],
            creds["AWS_SECRET_ACCESS_KEY"],
            creds["AWS_REGION"],
            "PUT",
            "cli-demo",
            "hello.txt",
            b"hi",
        )
        assert put.status == 200
        weed = int(m.group(1))
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0
    with pytest.raises(ProcessLookupError):
        os.kill(weed, 0)
