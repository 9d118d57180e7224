"""Stopping a running batch, with both engines, under real Airflow (dag.test), the real broker, real
Spark (spark-submit local[2] / a local Spark Connect server) and a SQLite ledger.

A batch is held running by a transform whose Python UDF waits (``e2e_transforms:hold_while_flagged``),
then stopped in the two ways the product must handle:

* the task is killed: the test sends SIGTERM to its own process while ``dag.test`` runs the ingest
  task — the Airflow task runner's SIGTERM handler calls the operator's ``on_kill``, exactly as in a
  task process that the supervisor terminates;
* the batch runs past its ``batch_timeout_s``.

Afterwards no process the batch started is left (the spark-submit JVM, its Python workers; for the
connect engine the server's Python worker that ran the batch's task), the server stays up, the batch
is ``failed`` in the ledger with a message saying what happened, the hand-off and scratch
directories are gone, and the replay DAG completes the batch: the sink holds every record once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from airflow_kafka_backpressure.hooks.spark_batch import work_root
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.sinks.parquet.commit import leftovers
from kbp_local.producer import produce

from . import airflow_harness as af
from .test_pipeline_e2e import airflow_db, make_pipeline, sink_ids  # noqa: F401 - fixtures

HOLD = "tests.integration.e2e_transforms:hold_while_flagged"
#: Bounds on waiting for things that must happen; generous: the machine is shared and slow.
UDF_START_WAIT_S = 300.0
EXIT_WAIT_S = 30.0


@pytest.fixture
def engine_setup(request, make_pipeline, tmp_path, monkeypatch):
    """``(engine, Connect server or None, make, hold flag)`` for each engine (``make_pipeline`` is
    the end-to-end tests' fixture, parametrized over both engines)."""
    engine = make_pipeline()[0].engine
    server = request.getfixturevalue("spark_connect") if engine == "connect" else None
    flag = tmp_path / "hold"
    monkeypatch.setenv("KBP_TEST_HOLD_FLAG", str(flag))
    return engine, server, make_pipeline, flag


def descendants(exclude_under: int | None = None) -> dict[int, psutil.Process]:
    """This process's descendants, less ``exclude_under`` and everything under it, from one walk
    of the process table: whether a process is under the excluded one is read from the same
    snapshot that finds it. (Asking a process for its parents afterwards raced: a Python worker
    that the Connect server's daemon forked as Spark replaced that daemon lost its parent in
    between, so it had no ancestors by then and was counted as the batch's; the CI rehearsal of
    2026-12-01 21:16 failed on such an orphan.)"""
    children: dict[int, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info["ppid"]
        if ppid is not None:
            children.setdefault(ppid, []).append(proc)
    out: dict[int, psutil.Process] = {}
    stack = [os.getpid()]
    while stack:
        for proc in children.get(stack.pop(), []):
            if proc.pid != exclude_under and proc.pid not in out:
                out[proc.pid] = proc
                stack.append(proc.pid)
    return out


class ProcessWatch:
    """Samples this process's descendants while a batch runs: those that were not there before are
    the batch's (spark-submit, its JVM, the Python workers it forks). ``exclude_under``: a process
    whose descendants are not the batch's (the Connect server: its Python workers are the server's)."""

    def __init__(self, exclude_under: int | None = None) -> None:
        self.exclude_under = exclude_under
        self.before = set(descendants(exclude_under))
        self.seen: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for pid, proc in descendants(self.exclude_under).items():
                if pid not in self.before and pid not in self.seen:
                    self.seen[pid] = proc
            self._stop.wait(0.2)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def held_pids(flag: Path) -> list[int]:
    marker = Path(str(flag) + ".pids")
    if not marker.exists():
        return []
    return [int(x) for x in marker.read_text().split()]


def wait_for_held_udf(flag: Path, timeout_s: float = UDF_START_WAIT_S) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = held_pids(flag)
        if pids:
            return pids
        time.sleep(0.2)
    return []


def kill_task_when_held(flag: Path, result: dict) -> threading.Thread:
    """SIGTERM this process (the task process under dag.test) once the batch's UDF is running."""

    def run() -> None:
        pids = wait_for_held_udf(flag)
        result["held"] = pids
        if pids:
            time.sleep(1.0)  # every task of the stage is in the UDF by now or soon: kill mid-batch
            result["killed_at"] = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def still_running(procs) -> list[str]:
    _, alive = psutil.wait_procs(list(procs), timeout=EXIT_WAIT_S)
    out = []
    for p in alive:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            continue
    return out


def check_stopped(engine, server, watch: ProcessWatch, held: list[int], *, require_held: bool = True) -> None:
    """Nothing the batch started runs on. ``require_held``: the batch's UDF must have started (the
    timeout test cannot insist: on a loaded machine the timeout may come first, which stops the
    batch all the same)."""
    assert held or not require_held, "the batch's UDF never started: the batch was not held running"
    gone = [psutil.Process(pid) for pid in held if psutil.pid_exists(pid)]
    assert not still_running(gone), "the Python worker(s) running the batch's task survived the stop"
    if engine == "submit":
        assert watch.seen, "no spark-submit process was seen while the batch ran"
        left = still_running(watch.seen.values())
        assert not left, f"processes the batch started are still running: {left}"
    else:
        # the batch started nothing on this side; its work ran on the server, which stays up
        assert not still_running(watch.seen.values())
        assert server.process.poll() is None, "the Spark Connect server died"
        # and the client left the task process as it found it (a later spark-submit from it works)
        assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


def check_failed_and_replay(
    make, p, ledger, release, kafka_broker, produced: int, expect_in_error: str, transform: str | None = HOLD
) -> dict:
    """The stopped batch is failed, nothing of its attempt is left, and once ``release()`` lets
    batches run again the replay DAG (same ``transform``) completes it exactly once; returns the
    replayed batch's manifest."""
    import json

    batch = ledger.batch(1)
    assert batch.status == "failed", (batch.status, batch.error)
    assert expect_in_error in batch.error, batch.error
    assert "Cannot execute" not in batch.error  # what happened, not a command line
    # nothing left of the attempt: hand-off directory under the sink, local scratch directory
    jobs = Path(p.sink) / "_kbp" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir()), list(jobs.iterdir())
    work = work_root() / "work"
    assert not (work.exists() and [d for d in work.iterdir() if f"{p.name}-batch-1-" in d.name])
    assert not (Path(p.sink) / "batch_id=1").exists()

    release()
    # the replay runs with the default timeout: the stop was the batch's, not the pipeline's
    p2, ledger = make(name=p.name, transform=transform, replay_interval_s=20, reader=p.reader)
    replay = af.run_dag(p2.replay_dag_id, 0)
    assert replay.state == "success", replay.task_states
    assert [x["batch_id"] for x in replay.xcoms["replay"]] == [1]
    assert ledger.batch(1).status == "replayed"
    assert sink_ids(p.sink) == Counter(range(produced))  # exactly once
    assert leftovers(p.sink, 1) == []
    with KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap}) as k:
        committed = k.committed_offsets(p.group, k.partitions(p.topics))
    assert sum(committed.values()) == produced
    return json.loads((Path(p.sink) / "batch_id=1" / "_manifest.json").read_text())


def test_killing_the_ingest_task_stops_the_batch_and_it_replays_exactly_once(engine_setup, kafka_broker):
    engine, server, make, flag = engine_setup
    p, ledger = make(name=f"kill_{engine}", transform=HOLD, replay_interval_s=20)
    produce(kafka_broker.bootstrap, p.topics[0], count=120, partitions=4)
    flag.touch()

    result: dict = {}
    with ProcessWatch(exclude_under=server.pid if server else None) as watch:
        killer = kill_task_when_held(flag, result)
        run = af.run_dag(p.ingest_dag_id, 0)
        killer.join(5)
    assert result.get("killed_at"), "the batch's UDF never started: nothing was killed"
    assert run.task_states["ingest"] == "failed", run.task_states
    check_stopped(engine, server, watch, held_pids(flag))
    check_failed_and_replay(make, p, ledger, flag.unlink, kafka_broker, 120, "killed")


def test_a_batch_over_its_timeout_is_stopped_and_replays_exactly_once(engine_setup, kafka_broker):
    engine, server, make, flag = engine_setup
    # the timeout may come before the job reaches the UDF on a loaded machine: the stop is checked
    # either way (require_held=False), and spark-submit has long started by then
    p, ledger = make(name=f"timeout_{engine}", transform=HOLD, replay_interval_s=20, batch_timeout_s=45)
    produce(kafka_broker.bootstrap, p.topics[0], count=120, partitions=4)
    flag.touch()

    with ProcessWatch(exclude_under=server.pid if server else None) as watch:
        run = af.run_dag(p.ingest_dag_id, 0)
    assert run.task_states["ingest"] == "failed", run.task_states
    check_stopped(engine, server, watch, held_pids(flag), require_held=False)
    check_failed_and_replay(make, p, ledger, flag.unlink, kafka_broker, 120, "timed out after 45 s")


@pytest.mark.parametrize("make_pipeline", ["connect"], indirect=True)
def test_connect_batches_share_a_kept_session_and_a_closed_one_is_replaced(
    make_pipeline, kafka_broker, spark_connect
):
    """Batches of a pipeline reuse one server-side session (its artifacts and Python workers stay
    warm); when the server has closed it, the next batch opens a new one and succeeds."""
    import json

    from pyspark.sql import SparkSession

    from airflow_kafka_backpressure.engines.connect import restored_environment, with_session_id

    p, ledger = make_pipeline(name="kept_session")
    sessions = work_root() / "connect-sessions.json"
    kept = lambda: set(json.loads(sessions.read_text()).values()) if sessions.exists() else set()  # noqa: E731
    before = kept()
    topic = p.topics[0]
    produce(kafka_broker.bootstrap, topic, count=40, partitions=4)
    assert af.run_dag(p.ingest_dag_id, 0).state == "success"
    [first] = kept() - before
    produce(kafka_broker.bootstrap, topic, count=40, partitions=4, start_id=40)
    assert af.run_dag(p.ingest_dag_id, 1).state == "success"
    assert kept() - before == {first}  # the second batch used the same session

    with restored_environment():  # the server closes the session (as after its idle timeout)
        SparkSession.builder.remote(with_session_id(spark_connect.url, first)).create().stop()
    produce(kafka_broker.bootstrap, topic, count=40, partitions=4, start_id=80)
    r = af.run_dag(p.ingest_dag_id, 2)
    assert r.state == "success", r.task_states
    assert first not in kept() and len(kept() - before) == 1  # replaced by a new session
    assert sink_ids(p.sink) == Counter(range(120))
    assert [b.status for b in sorted(ledger.recent_batches(p.name), key=lambda b: b.batch_id)] == [
        "succeeded"
    ] * 3


#: A stand-in for an Airflow task process: runs one batch of the pipeline named in argv through
#: the submit engine, as the ingest operator does (SparkBatchHook.run, connections from the env).
TASK_PROCESS = """
import json, sys
from airflow_kafka_backpressure.hooks.spark_batch import SparkBatchHook
from airflow_kafka_backpressure.batch.models import BatchPlan
from airflow_kafka_backpressure.config.pipeline import load_pipelines
[p] = [p for p in load_pipelines() if p.name == sys.argv[1]]
SparkBatchHook.for_pipeline(p).run(BatchPlan.from_dict(json.loads(sys.argv[2])), 1, {"bootstrap.servers": sys.argv[3]})
"""


@pytest.mark.parametrize("make_pipeline", ["submit"], indirect=True)
def test_a_task_process_killed_outright_takes_its_spark_application_with_it(engine_setup, kafka_broker):
    """SIGKILL leaves the task process no chance to stop anything: the driver notices that its
    launcher is gone, ends the application (JVM, driver, Python workers) by itself and removes the
    attempt's hand-off directory and local scratch directory (with the private properties file of
    secret Spark settings)."""
    import json
    import subprocess
    import sys

    from airflow_kafka_backpressure.batch.models import OffsetRange

    _, _, make, flag = engine_setup
    p, ledger = make(
        name="orphan_submit",
        transform=HOLD,
        spark_conf={"spark.hadoop.fs.s3a.secret.key": "test-only-not-a-secret"},
    )
    ledger.upgrade()
    produce(kafka_broker.bootstrap, p.topics[0], count=40, partitions=4)
    plan = ledger.record_plan(
        p.name,
        "manual__orphan",
        [OffsetRange(p.topics[0], q, 0, 10) for q in range(4)],
        p.sink,
        p.batch_interval_ms,
        int(time.time() * 1000),
    )
    flag.touch()
    task = subprocess.Popen(
        [sys.executable, "-c", TASK_PROCESS, p.name, json.dumps(plan.to_dict()), kafka_broker.bootstrap],
        start_new_session=True,
    )
    started: list[psutil.Process] = []
    try:
        held = wait_for_held_udf(flag)
        assert held, "the batch's UDF never started: the batch was not held running"
        started = psutil.Process(task.pid).children(recursive=True)
        assert any("SparkSubmit" in " ".join(c.cmdline()) for c in started), [
            c.cmdline()[:3] for c in started
        ]
        jobs = Path(p.sink) / "_kbp" / "jobs"
        [scratch] = [d for d in (work_root() / "work").iterdir() if d.name.startswith(f"{p.name}-batch-1-")]
        assert (scratch / "secret.properties").exists() and (jobs / scratch.name).is_dir()
        task.kill()
        task.wait()
        left = still_running([*started, *(psutil.Process(pid) for pid in held if psutil.pid_exists(pid))])
        assert not left, f"the batch's processes outlived the task process that started them: {left}"
        assert not scratch.exists(), sorted(str(f) for f in scratch.rglob("*"))
        assert not any(jobs.iterdir()), list(jobs.iterdir())
    finally:
        flag.unlink(missing_ok=True)
        if task.poll() is None:
            task.kill()
        for proc in started:
            try:
                proc.kill()
            except psutil.Error:
                pass
