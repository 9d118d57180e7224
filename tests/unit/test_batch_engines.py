"""Pure parts of the batch engines and the sink: executor settings, secret settings, the sealed
hand-off, exit descriptions, the read tally, the supervision of a run (timeouts, stops)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from airflow_kafka_backpressure.batch import handoff
from airflow_kafka_backpressure.batch.models import (
    BatchMetrics,
    BatchPlan,
    JobSpec,
    OffsetRange,
    TopicPartition,
)
from airflow_kafka_backpressure.engines import BatchJobError, BatchStopped, Engine, supervise
from airflow_kafka_backpressure.engines.submit import (
    executor_conf,
    exit_description,
    is_loopback_master,
    split_secret_conf,
    write_properties_file,
)
from airflow_kafka_backpressure.sinks.completion import tally_reads
from airflow_kafka_backpressure.sinks.parquet.commit import check_replaceable
from airflow_kafka_backpressure.storage import StorageError, location


def test_executor_conf_per_cluster_manager():
    assert executor_conf("spark://h:7077", 3, 2) == {
        "spark.executor.cores": "2",
        "spark.cores.max": "6",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    }
    assert executor_conf("yarn", 3, 2) == {"spark.executor.instances": "3", "spark.executor.cores": "2"}
    assert executor_conf("k8s://https://api:6443", 4, 1)["spark.executor.instances"] == "4"
    assert executor_conf("local[2]", 3, 1) == {}


def test_loopback_masters_bind_spark_to_loopback():
    assert is_loopback_master("local[2]")
    assert is_loopback_master("spark://127.0.0.1:7077")
    assert is_loopback_master("spark://localhost:7077,127.0.0.1:7078")
    assert not is_loopback_master("spark://10.0.0.5:7077")
    assert not is_loopback_master("yarn")


def test_secret_spark_settings_go_to_a_private_properties_file(tmp_path):
    conf = {
        "spark.hadoop.fs.s3a.secret.key": "S3CR3T",
        "spark.hadoop.fs.s3a.access.key": "AKIA",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "AZ",
        "spark.kubernetes.authenticate.oauthToken": "OAUTH-VALUE",
        # no secret word Spark's redaction knows: secret all the same (not known to be safe)
        "spark.hadoop.fs.s3a.encryption.key": "SSE-KEY",
        "spark.hadoop.fs.gs.auth.service.account.private.key": "GS-KEY",
        "spark.hadoop.fs.azure.sas.box.acct.blob.core.windows.net": "SAS-TOKEN",
        "spark.sql.catalog.lake.uri": "jdbc:postgresql://u:pw@h/db",
        "spark.some.plugin.setting": "plugin-value-1",
        "spark.sql.shuffle.partitions": "8",
        "spark.executor.memory": "2g",
    }
    plain, secret = split_secret_conf(conf)
    regex = plain.pop("spark.redaction.regex")
    assert plain == {"spark.sql.shuffle.partitions": "8", "spark.executor.memory": "2g"}
    assert set(secret) == set(conf) - set(plain)
    # Spark's UI and event log redact every one of them by name (Java's \Q...\E quoting)
    assert regex.startswith("(?i)secret|password|token|access[.]?key|")
    named = {k.removeprefix("spark.hadoop.") for k in secret}  # Hadoop's names match both forms
    assert all(f"\\Q{k}\\E" in regex for k in named)
    assert not any(v in regex for v in secret.values())
    path = tmp_path / "s.properties"
    write_properties_file(path, {"a.secret": "x=y:z\\n"})
    assert (path.stat().st_mode & 0o777) == 0o600
    assert path.read_text() == "a.secret=x\\=y\\:z\\\\n\n"


def test_exit_descriptions_never_repeat_the_command_line():
    err = RuntimeError("Cannot execute: spark-submit --conf spark.x=SECRET app.py. Error code is: -9.")
    assert exit_description(err) == "spark-submit was killed by SIGKILL"
    assert exit_description(RuntimeError("... Error code is: 1.")) == "spark-submit exited with code 1"
    assert "SECRET" not in exit_description(RuntimeError("spark-submit --conf spark.x=SECRET"))
    assert exit_description(None) == "spark-submit exited normally"


def _spec(tmp_path, kafka=None) -> JobSpec:
    plan = BatchPlan("p", 3, "r", (OffsetRange("t", 0, 0, 10),), str(tmp_path / "sink"), 1000, 0)
    return JobSpec(
        plan=plan, kafka=kafka or {"bootstrap.servers": "h:1", "sasl.password": "pw-123"}, launched_at_ms=5
    )


def test_the_handoff_seals_kafka_properties_and_the_driver_takes_the_spec(tmp_path):
    spec = _spec(tmp_path)
    job = handoff.job_dir(spec.plan.sink, "a1")
    uri, key = handoff.write_spec(job, spec)
    text = (tmp_path / "sink" / "_kbp" / "jobs" / "a1" / "spec.json").read_text()
    assert "pw-123" not in text and "h:1" not in text
    with pytest.raises(handoff.HandoffError, match=handoff.SPEC_KEY_ENV):
        handoff.take_spec(uri, None)
    uri, key = handoff.write_spec(job, spec)
    _, other = handoff.seal({"x": 1})
    with pytest.raises(handoff.HandoffError):
        handoff.take_spec(uri, other)
    uri, key = handoff.write_spec(job, spec)
    assert handoff.take_spec(uri, key) == spec
    assert not location(uri).exists()  # taken: gone from the shared filesystem
    assert handoff.read_result(job) is None
    m = BatchMetrics(3, 10, 100, 5, 6, 7, 1)
    handoff.write_metrics(job, m)
    assert handoff.read_result(job) == m
    job.delete()
    handoff.write_error(job, "boom")
    assert handoff.read_result(job) == "boom"


def test_storage_refuses_relative_locations():
    with pytest.raises(StorageError, match="not an absolute path"):
        location("relative/sink")


def test_read_tally_counts_ranges_tiled_by_completed_reads():
    a0, a1 = OffsetRange("a", 0, 0, 10), OffsetRange("a", 1, 5, 9)
    empty = OffsetRange("a", 2, 4, 4)
    done = [(OffsetRange("a", 0, 0, 4), 4, 40), (OffsetRange("a", 0, 4, 10), 5, 50)]  # a gap from compaction
    counts, nbytes, unread = tally_reads([a0, a1, empty], done)
    assert counts == {TopicPartition("a", 0): 9, TopicPartition("a", 2): 0}
    assert nbytes == 90 and unread == [a1]
    # a hole, or a piece past the range, is not a complete read
    _, _, unread = tally_reads([a0], [(OffsetRange("a", 0, 0, 4), 4, 1), (OffsetRange("a", 0, 5, 10), 5, 1)])
    assert unread == [a0]
    # a task attempt that re-read a piece does not double it
    counts, _, _ = tally_reads([a0], done + done)
    assert counts[TopicPartition("a", 0)] == 9


def test_a_committed_batch_is_replaced_only_by_the_same_pipeline_and_ranges():
    r = [OffsetRange("t", 0, 0, 5)]
    existing = {"pipeline": "p", "ranges": [x.to_dict() for x in r]}
    check_replaceable(existing, {"pipeline": "p"}, r, "/s/batch_id=1")
    check_replaceable(None, {"pipeline": "q"}, r, "/s/batch_id=1")
    with pytest.raises(RuntimeError, match="another pipeline, 'p'.*two pipelines share this sink"):
        check_replaceable(existing, {"pipeline": "q"}, r, "/s/batch_id=1")
    with pytest.raises(RuntimeError, match="ledger was reset"):
        check_replaceable(existing, {"pipeline": "p"}, [OffsetRange("t", 0, 5, 9)], "/s/batch_id=1")
    # a replay's write of the same ranges trimmed at their start (retention took offsets 0-1) replaces it
    check_replaceable(existing, {"pipeline": "p"}, [OffsetRange("t", 0, 2, 5)], "/s/batch_id=1")
    with pytest.raises(RuntimeError, match="ledger was reset"):  # but not one that ends elsewhere
        check_replaceable(existing, {"pipeline": "p"}, [OffsetRange("t", 0, 2, 6)], "/s/batch_id=1")


class _Sleeper(Engine):
    """Waits until stopped (or ``finish`` is set); records how it was stopped."""

    name = "test"

    def __init__(self, result=None):
        super().__init__()
        self.finish = threading.Event()
        self.result = result

    def run(self, spec):
        self.finish.wait(30)
        if self.stop_reason is not None:
            raise RuntimeError("the Spark work died because it was stopped")
        return self.result

    def _stop(self):
        self.finish.set()


def test_supervise_returns_the_result_of_a_run(tmp_path):
    spec = _spec(tmp_path)
    engine = _Sleeper(BatchMetrics(3, 1, 1, 1, 1, 1, 1))
    threading.Timer(0.2, engine.finish.set).start()
    assert supervise(engine, spec, timeout_s=20, poll_s=0.05) == engine.result


def test_supervise_stops_a_run_over_its_timeout_with_a_clear_error(tmp_path):
    spec = _spec(tmp_path)
    engine = _Sleeper()
    with pytest.raises(BatchStopped, match="timed out after 0.3 s"):
        supervise(engine, spec, timeout_s=0.3, poll_s=0.05)


def test_a_stop_from_another_thread_ends_the_run_as_stopped(tmp_path):
    spec = _spec(tmp_path)
    engine = _Sleeper()
    threading.Timer(0.2, engine.stop, args=("the Airflow task was killed",)).start()
    with pytest.raises(BatchStopped, match="the Airflow task was killed") as err:
        supervise(engine, spec, timeout_s=20, poll_s=0.05)
    assert isinstance(err.value, BatchJobError) and err.value.batch_id == 3


class _Stuck(Engine):
    """A run that does not end when stopped (e.g. blocked in a call that nothing can interrupt)."""

    name = "test"

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def run(self, spec):
        self.blocked_in_an_uninterruptible_call()

    def blocked_in_an_uninterruptible_call(self):
        self.release.wait(30)

    def _stop(self):
        pass


def test_a_run_that_ignores_its_stop_is_given_up_and_the_log_says_where_it_is_stuck(
    tmp_path, monkeypatch, caplog
):
    import airflow_kafka_backpressure.engines as engines

    monkeypatch.setattr(engines, "STOP_GRACE_S", 0.3)
    engine = _Stuck()
    try:
        with caplog.at_level("ERROR", logger="airflow_kafka_backpressure.engines"):
            with pytest.raises(BatchStopped, match="timed out after 0.2 s"):
                supervise(engine, _spec(tmp_path), timeout_s=0.2, poll_s=0.05)
    finally:
        engine.release.set()
    (record,) = [r for r in caplog.records if "giving up" in r.getMessage()]
    assert "blocked_in_an_uninterruptible_call" in record.getMessage()


def test_supervise_stops_the_run_when_the_task_loses_its_supervisor(tmp_path):
    spec = _spec(tmp_path)
    engine = _Sleeper()
    with pytest.raises(BatchStopped, match="supervisor .* is gone"):
        supervise(engine, spec, timeout_s=20, poll_s=0.05, parent_pid=-1)  # "the parent changed"


def test_an_interrupted_wait_stops_the_run_and_reraises(tmp_path):
    spec = _spec(tmp_path)
    engine = _Sleeper()

    class Interrupt(Exception):
        pass

    def interrupt():
        raise Interrupt()

    started = time.monotonic()
    with pytest.raises(Interrupt):
        supervise(engine, spec, timeout_s=20, poll_s=0.05, on_start=interrupt)
    assert engine.stop_reason and "interrupted" in engine.stop_reason
    assert time.monotonic() - started < 20


def test_the_connect_engine_leaves_no_connect_mode_in_the_process_environment(monkeypatch):
    """pyspark sets SPARK_CONNECT_MODE_ENABLED (and maybe SPARK_REMOTE) when a Connect session is
    created; a later spark-submit from the same process would inherit them and fail."""
    from airflow_kafka_backpressure.engines.connect import restored_environment

    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    monkeypatch.setenv("SPARK_REMOTE", "sc://user-set:1")
    monkeypatch.delenv("SPARK_LOCAL_REMOTE", raising=False)
    with restored_environment():
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        os.environ["SPARK_REMOTE"] = "sc://engine:2"
        os.environ["SPARK_LOCAL_REMOTE"] = "1"
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ and "SPARK_LOCAL_REMOTE" not in os.environ
    assert os.environ["SPARK_REMOTE"] == "sc://user-set:1"  # what the user had is kept


def test_operators_and_hooks_hold_no_spark_session_code():
    """Spark sessions live in the engines (connect) and in spark/ (the driver program): the
    operators and hooks only choose and supervise an engine."""
    import ast
    from pathlib import Path

    import airflow_kafka_backpressure as pkg

    root = Path(pkg.__file__).parent
    offending = []
    for folder in ("operators", "hooks"):
        for path in sorted((root / folder).glob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Name | ast.Attribute):
                    names = [node.id if isinstance(node, ast.Name) else node.attr]
                for name in names:
                    if name.split(".")[0] == "pyspark" or name in ("SparkSession", "_jvm", "sparkContext"):
                        offending.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    assert not offending


def test_the_submit_engine_locates_the_driver_program_without_importing_it():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from airflow_kafka_backpressure.engines.submit import job_script_path\n"
        "path = job_script_path()\n"
        "assert path.endswith('spark/job.py'), path\n"
        "assert 'airflow_kafka_backpressure.spark.job' not in sys.modules\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )


def test_connect_session_ids_are_kept_per_key_and_renewed(tmp_path):
    from airflow_kafka_backpressure.engines.connect import (
        SessionIds,
        content_key,
        session_closed,
        with_session_id,
    )

    ids = SessionIds(tmp_path / "sessions.json")
    a = ids.get("a")
    assert ids.get("a") == a != ids.get("b")
    assert SessionIds(tmp_path / "sessions.json").get("a") == a  # kept across processes
    renewed = ids.renew("a")
    assert renewed != a and ids.get("a") == renewed
    (tmp_path / "sessions.json").write_text("{broken")
    assert ids.get("a")  # a damaged file only costs a new session

    f = tmp_path / "code.zip"
    f.write_bytes(b"one")
    k1 = content_key("sc://h:1/", "p", files=(str(f),))
    f.write_bytes(b"two")
    assert content_key("sc://h:1/", "p", files=(str(f),)) != k1  # new code, new session
    assert content_key("sc://h:1/", "q", files=(str(f),)) != content_key("sc://h:1/", "p", files=(str(f),))

    assert with_session_id("sc://h:1", "S") == "sc://h:1/;session_id=S"
    assert with_session_id("sc://h:1/;token=t", "S") == "sc://h:1/;token=t;session_id=S"
    assert session_closed(RuntimeError("[INVALID_HANDLE.SESSION_CLOSED] The handle x is invalid."))
    assert not session_closed(RuntimeError("UNAVAILABLE: connection refused"))


def test_an_unreachable_connect_server_fails_the_batch_at_once_naming_the_connection(tmp_path):
    """A real closed port on 127.0.0.1 (bound, then released): the engine answers before pyspark's
    minutes of retries, with the URL, the connection id and how to start a server."""
    import socket

    from airflow_kafka_backpressure.engines.connect import ConnectEngine, server_unreachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sc://127.0.0.1:{port}/;user_id=kbp;token=s3cret"
    assert "no answer at 127.0.0.1:" in (server_unreachable(url) or "")
    engine = ConnectEngine(url, work_root=tmp_path, conn_id="spark_connect_orders")
    with pytest.raises(BatchJobError) as err:
        engine.run(_spec(tmp_path))
    message = str(err.value)
    assert f"sc://127.0.0.1:{port}/" in message and "'spark_connect_orders'" in message
    assert "kbp_local spark-connect" in message
    assert "s3cret" not in message

    with socket.socket() as listening:  # something accepts: no problem reported
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        assert server_unreachable(f"sc://127.0.0.1:{listening.getsockname()[1]}") is None


def test_the_connect_engine_refuses_spark_settings_not_known_to_hold_no_secret_before_any_session(tmp_path):
    """Issue 39, item 11: a session's settings reach its jobs as local properties, which a Connect
    server's event log records unredacted: credentials (whatever their names) belong to the server."""
    from airflow_kafka_backpressure.engines.connect import ConnectEngine

    engine = ConnectEngine(
        "sc://127.0.0.1:1",  # nothing listens: the refusal comes first
        work_root=tmp_path,
        spark_conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.hadoop.fs.s3a.encryption.key": "sse-v4lue",
            "spark.hadoop.fs.s3a.secret.key": "s3-v4lue",
        },
    )
    with pytest.raises(BatchJobError) as err:
        engine.run(_spec(tmp_path))
    message = str(err.value)
    assert "spark.hadoop.fs.s3a.encryption.key, spark.hadoop.fs.s3a.secret.key" in message
    assert "Connect server's own configuration" in message and "spark.sql.shuffle.partitions" not in message
    assert "v4lue" not in message


def test_the_launcher_watch_reads_parents_from_proc_and_ignores_a_missing_or_bad_pid():
    from airflow_kafka_backpressure.spark.launcher_watch import launcher_pid, parent_of

    assert parent_of(os.getpid()) == os.getppid()
    assert parent_of(2**22 + 12345) is None  # above Linux's pid_max: no such process
    assert launcher_pid({"KBP_LAUNCHER_PID": "4242"}) == 4242
    assert launcher_pid({}) is None and launcher_pid({"KBP_LAUNCHER_PID": "x"}) is None
    assert launcher_pid({"KBP_LAUNCHER_PID": "1"}) is None  # init: a re-parented JVM, not a launcher


def test_stopping_the_jvm_ends_a_process_that_ignores_sigterm_and_counts_a_zombie_as_ended():
    import subprocess
    import sys

    from airflow_kafka_backpressure.spark.launcher_watch import has_ended, stop_jvm

    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        stubborn.stdout.readline()  # its SIGTERM handler is in place
        assert not has_ended(stubborn.pid)
        assert stop_jvm(stubborn.pid, grace_s=0.5) is True
        # not reaped yet (this test is its parent and has not waited): a zombie has ended all the same
        assert has_ended(stubborn.pid)
        assert stubborn.wait(5) == -9
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()
    assert has_ended(2**22 + 12345)


def test_a_driver_whose_launcher_died_removes_the_attempts_handoff_and_scratch_directories_only(tmp_path):
    from airflow_kafka_backpressure.spark.launcher_watch import remove_attempt_files

    attempt = "p-batch-3-abc123"
    job = handoff.job_dir(str(tmp_path / "sink"), attempt)
    job.child("error.json").write_bytes(b"{}")
    scratch = tmp_path / "work" / attempt
    (scratch / "spark-local").mkdir(parents=True)
    (scratch / "secret.properties").write_text("spark.hadoop.fs.s3a.secret.key=x\n")
    other = tmp_path / "work" / "p-batch-4-def456"
    other.mkdir()

    remove_attempt_files(job, {handoff.SCRATCH_DIR_ENV: str(other)})  # not this attempt's: kept
    assert not job.exists() and other.exists() and scratch.exists()
    remove_attempt_files(job, {handoff.SCRATCH_DIR_ENV: attempt})  # relative: kept
    assert scratch.exists()
    remove_attempt_files(job, {handoff.SCRATCH_DIR_ENV: str(scratch)})
    assert not scratch.exists() and other.exists()
    remove_attempt_files(job, {})  # nothing left, nothing named: no error


def test_once_the_launcher_is_gone_the_driver_hands_nothing_back_and_waits_for_the_watch():
    from airflow_kafka_backpressure.spark.launcher_watch import LauncherWatch

    ended = threading.Event()
    watch = LauncherWatch(threading.Thread(target=ended.wait))
    written: list[str] = []
    assert watch.hand_back(lambda: written.append("metrics")) is True
    watch.settle()  # launcher still there: returns at once
    watch._set_orphaned()
    assert watch.orphaned and watch.hand_back(lambda: written.append("error")) is False
    assert written == ["metrics"]
    watch.thread.start()
    settled = threading.Thread(target=watch.settle)
    settled.start()
    settled.join(0.5)
    assert settled.is_alive()  # the driver does not exit before the watch has done its work
    ended.set()
    settled.join(5)
    assert not settled.is_alive()
    LauncherWatch().settle()  # nothing watched: nothing to wait for


def test_the_spark_master_comes_from_the_engines_module():
    """The plan task asks the engine where batches run (a local sink is refused under a master with
    executors on other hosts): submit answers its connection's master, connect has none to give."""
    from airflow_kafka_backpressure import engines

    class Hook:
        def submit_connection(self) -> tuple[str, str]:
            return "spark://10.1.2.3:7077", "client"

    assert engines.spark_master("submit", Hook()) == "spark://10.1.2.3:7077"
    assert engines.spark_master("connect", Hook()) is None
    with pytest.raises(ValueError, match="engine = 'yarn' is invalid: use one of submit, connect"):
        engines.spark_master("yarn", Hook())
