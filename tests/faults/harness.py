"""The fault harness: the shipped DAGs under a real ``airflow standalone`` (scheduler, DAG processor,
triggerer, API server), a broker of its own, real Spark (``spark-submit``, local[2]) and real ledgers.

Used by ``tests/faults/`` and ``bench/soak.py``. No mocks: faults are signals sent to real
processes (the Spark driver JVM, the Airflow task process, the broker, PostgreSQL) and real Airflow
operations (clearing a run, ``airflow backfill create``).

:class:`Standalone` runs ``airflow standalone`` in a temporary ``AIRFLOW_HOME`` in its own session
(process group). :meth:`Standalone.stop` stops that group **and** every process found under it by
a psutil tree walk from its PID (task processes, ``spark-submit`` JVMs), first with SIGTERM, then
SIGKILL — by PID, never by name; likewise the session of every scheduler started in place of a dead
one (:meth:`Standalone.revive_scheduler`), whose tasks run there. Every process lookup of the
harness (:meth:`Standalone.processes`) covers all of these sessions.

:func:`check_pipeline` reads the sink back with pyarrow (not Spark, not the job's code) and says
what is wrong: a record missing and not recorded as lost, a record twice, the consumer group short
of the end, a batch left in planned/running/replaying/failed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import requests

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.engines.process import stop_processes
from airflow_kafka_backpressure.kafka.offsets import KafkaOffsets
from airflow_kafka_backpressure.ledger import Ledger
from kbp_local.process import free_port

from .pause_point import INJECT_DIR

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "kafka_backpressure_pipelines.py"
IN_FLIGHT = ("planned", "running", "replaying")


class HarnessError(RuntimeError):
    pass


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout_s: float,
    every_s: float = 1.0,
    transient: tuple[type[BaseException], ...] = (requests.RequestException, OSError),
) -> Any:
    """Poll ``check`` until it returns something truthy; HarnessError naming ``what`` after the
    timeout. ``transient`` errors (a service between restarts) count as not yet."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except transient as e:
            last_error = e
        if time.monotonic() > deadline:
            raise HarnessError(
                f"timed out after {timeout_s:.0f}s waiting for {what}"
                + (f" ({last_error})" if last_error else "")
            )
        time.sleep(every_s)


# ----- process trees --------------------------------------------------------------------------------
def process_tree(pid: int) -> list[psutil.Process]:
    """``pid``, everything under it, and every process of its session (a task process re-parented
    to init after its supervisor died is still in the session)."""
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        found[pid] = root
        for c in root.children(recursive=True):
            found[c.pid] = c
    except psutil.Error:
        pass
    for p in psutil.process_iter():
        try:
            if p.pid not in found and os.getsid(p.pid) == pid:
                found[p.pid] = p
                for c in p.children(recursive=True):
                    found[c.pid] = c
        except (psutil.Error, OSError):
            continue
    return list(found.values())


def stop_tree(pid: int, grace_s: float = 15.0) -> list[int]:
    """SIGTERM the session/group of ``pid`` and every process under it, SIGKILL what is left after
    ``grace_s`` (and what started meanwhile); returns the PIDs that had to be killed."""
    procs = process_tree(pid)
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass
    killed = stop_processes(procs, grace_s=grace_s)
    return killed + stop_processes([p for p in process_tree(pid) if p.is_running()], grace_s=1.0)


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def command_lines_holding(secret: str) -> list[str]:
    """The command lines (``ps``) of this machine's processes that hold ``secret``."""
    return [f"pid {p.pid}: {line}" for p in psutil.process_iter() if secret in (line := cmdline(p))]


def files_holding(root: Path, secret: str, skip: Iterable[Path] = ()) -> list[str]:
    """Every file under ``root`` (but not under a folder of ``skip``) whose bytes hold ``secret``."""
    needle, skipped = secret.encode(), [s.resolve() for s in skip]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if (Path(folder) / d).resolve() not in skipped]
        for name in files:
            path = Path(folder) / name
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:  # gone meanwhile (a Spark temp file), or a socket
                continue
    return found


#: What Airflow logs when its scheduler loop ends on an exception.
LOOP_ENDED = "Exception when executing SchedulerJob._run_scheduler_loop"


# ----- airflow standalone -------------------------------------------------------------------------
@dataclass
class Standalone:
    """``airflow standalone`` for ``pipelines`` in ``home``; connections as environment variables."""

    home: Path
    pipelines: list[PipelineConfig]
    connections: dict[str, dict[str, Any]]
    extra_env: dict[str, str] = field(default_factory=dict)
    #: DAG files served beside the shipped one
    dag_files: list[Path] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None
    #: Schedulers started in place of a dead one (:meth:`revive_scheduler`), the live one last. Each
    #: runs in a session of its own, which holds the tasks its executor started.
    replacement_schedulers: list[subprocess.Popen] = field(default_factory=list)
    jwt_secret: str = field(default_factory=lambda: secrets.token_hex(48))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(32))
    _token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "KBP_"))}
        venv_bin = str(Path(sys.executable).parent)
        dags = self.home / "dags"
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,  # one per installation: every
                "AIRFLOW__API__SECRET_KEY": self.secret_key,  # component must trust the others' tokens
                # the DAG file and its pipelines file never change after start: parsed at start, then
                # once a minute (every 5 s it cost ~12% of a core beside the suite's other shard)
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "60",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                "KBP_PIPELINES_FILE": str(self.home / "pipelines.json"),
                "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
                # this checkout wins, in tasks and in the Spark driver; inject/ registers the suite's pause
                # on the product's seam when PAUSE_DIR_ENV is set (tests/faults/pause_point.py)
                "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), str(REPO)]),
                "SPARK_LOCAL_IP": "127.0.0.1",
                "PYSPARK_PYTHON": sys.executable,
                "TMPDIR": str(self.home / "tmp"),
            }
        )
        for conn_id, conn in self.connections.items():
            env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
        env.update(self.extra_env)
        return env

    def airflow(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """An ``airflow`` CLI command against this installation (again while SQLite says locked)."""
        for _ in range(10):
            done = subprocess.run(
                [str(Path(sys.executable).parent / "airflow"), *args],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=self.home,
            )
            if done.returncode == 0 or "database is locked" not in done.stdout + done.stderr:
                break
            time.sleep(2)
        return done

    def start(self, timeout_s: float = 180) -> Standalone:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "tmp").mkdir(exist_ok=True)
        (self.home / "dags").mkdir(exist_ok=True)
        for dag_file in (DAG_FILE, *self.dag_files):
            shutil.copy(dag_file, self.home / "dags" / dag_file.name)
        (self.home / "pipelines.json").write_text(
            json.dumps({"pipelines": [p.to_dict() for p in self.pipelines]})
        )
        self.port = self.port or free_port()
        migrated = self.airflow("db", "migrate")
        if migrated.returncode != 0:
            raise HarnessError(f"airflow db migrate failed:\n{migrated.stderr[-3000:]}")
        log = open(self.home / "standalone.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), "standalone"],
                env=self.env(),
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise HarnessError(
                    f"airflow standalone exited ({self.proc.returncode}); see {self.home / 'standalone.log'}"
                )
            r = requests.get(f"{self.url}/api/v2/monitor/health", timeout=5)
            return r.ok and r.json().get("scheduler", {}).get("status") == "healthy"

        try:
            wait_for("airflow standalone to be healthy", healthy, timeout_s)
            for p in self.pipelines:
                for dag_id in (p.ingest_dag_id, p.replay_dag_id):
                    wait_for(
                        f"DAG {dag_id} to be parsed",
                        lambda d=dag_id: self.get(f"/api/v2/dags/{d}", ok404=True),
                        timeout_s,
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def processes(self) -> list[psutil.Process]:
        """Every process of this installation: the standalone's tree and session, and the tree and
        session of every scheduler started in place of a dead one (:meth:`revive_scheduler`), whose
        executor runs the tasks, and so the Spark drivers, from then on."""
        found: dict[int, psutil.Process] = {}
        roots = ([self.proc] if self.proc is not None else []) + self.replacement_schedulers
        for root in roots:
            found.update((p.pid, p) for p in process_tree(root.pid))
        return list(found.values())

    def schedulers(self) -> list[psutil.Process]:
        """The ``airflow scheduler`` processes of this installation (a dead one is not listed)."""
        return [p for p in self.processes() if cmdline(p).endswith(" scheduler")]

    def kill_schedulers(self, timeout_s: float = 30.0) -> list[int]:
        """SIGKILL every scheduler of this installation and wait until each has exited; their PIDs.
        A scheduler started in place of a dead one is this process's child: it is reaped here, else
        it would count as running (``Popen.poll()``) for as long as the kill takes to land."""
        killed = self.schedulers()
        for proc in killed:
            proc.send_signal(signal.SIGKILL)
        pids = {proc.pid for proc in killed}
        for child in self.replacement_schedulers:
            if child.pid in pids:
                child.wait(timeout=timeout_s)

        def exited(proc: psutil.Process) -> bool:
            # the standalone's own scheduler stays a zombie until the standalone reaps it (it may
            # not): dead all the same, and not listed by schedulers()
            try:
                return proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_for(
            f"the killed schedulers {sorted(pids)} to exit",
            lambda: all(exited(proc) for proc in killed),
            timeout_s,
            every_s=0.1,
        )
        return sorted(pids)

    def scheduler_running(self) -> bool:
        """Whether this installation's scheduler (the standalone's, or the last one started in its
        place) is alive and its loop has not ended."""
        if self.replacement_schedulers:
            live = self.replacement_schedulers[-1]
            return live.poll() is None and not self._loop_ended(self.home / "scheduler.log")
        if self.proc is None or self._loop_ended(self.home / "standalone.log"):
            return False
        return bool(self.schedulers())

    @staticmethod
    def _loop_ended(log: Path) -> bool:
        """Airflow logged that its scheduler loop ended (the process may live on, scheduling nothing)."""
        try:
            return LOOP_ENDED in log.read_text(errors="replace")
        except OSError:
            return False

    def revive_scheduler(self) -> bool:
        """Start a scheduler when the standalone's has died (``airflow standalone`` does not restart
        it). Seen twice under load: after ``airflow backfill create`` Airflow's scheduler hit an
        IntegrityError creating the backfill runs' task instances in the SQLite metadata DB, and
        its loop ended; every later step then waited for nothing. Returns whether it did.

        Only the dead scheduler's process is stopped: the tasks it started run on (their supervisors
        report to the API server), as when a production scheduler dies."""
        if self.proc is None or self.scheduler_running():
            return False
        stop_processes(self.schedulers(), grace_s=10.0)  # a scheduler whose loop ended, still running
        (self.home / "scheduler.log").unlink(missing_ok=True)
        warnings.warn(
            f"airflow scheduler died (see {self.home / 'standalone.log'}): started a new one", stacklevel=2
        )
        log = open(self.home / "scheduler.log", "ab")
        try:
            self.replacement_schedulers.append(
                subprocess.Popen(
                    [str(Path(sys.executable).parent / "airflow"), "scheduler"],
                    env=self.env(),
                    cwd=self.home,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        finally:
            log.close()
        return True

    def stop(self) -> list[int]:
        replacements, self.replacement_schedulers = self.replacement_schedulers, []
        killed = [pid for r in replacements for pid in stop_tree(r.pid)]
        proc, self.proc = self.proc, None
        if proc is None:
            return killed
        killed += stop_tree(proc.pid)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return killed

    # ----- REST ---------------------------------------------------------------------------------
    def token(self) -> str:
        if self._token is None:
            pw_file = self.home / "simple_auth_manager_passwords.json.generated"
            password = wait_for(
                "the admin password file",
                lambda: pw_file.exists() and json.loads(pw_file.read_text()).get("admin"),
                60,
            )
            r = requests.post(
                f"{self.url}/auth/token", json={"username": "admin", "password": password}, timeout=10
            )
            r.raise_for_status()
            self._token = r.json()["access_token"]
        return self._token

    def _request(self, method: str, path: str, **kw: Any) -> requests.Response:
        extra_headers = kw.pop("headers", {})
        for attempt in range(10):
            headers = {**extra_headers, "Authorization": f"Bearer {self.token()}"}
            r = requests.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kw)
            if r.status_code == 401:  # expired token
                self._token = None
            elif r.status_code < 500:  # 5xx: SQLite "database is locked" under load; try again
                return r
            time.sleep(min(2.0 * (attempt + 1), 10))
        return r

    def get(self, path: str, ok404: bool = False, **params: Any) -> Any:
        r = self._request("GET", path, params=params)
        if ok404 and r.status_code == 404:
            return None
        if not r.ok:
            raise HarnessError(f"GET {path}: {r.status_code} {r.text[:500]}")
        return r.json()

    def call(self, method: str, path: str, body: Any) -> Any:
        r = self._request(method, path, json=body)
        if not r.ok:
            raise HarnessError(f"{method} {path}: {r.status_code} {r.text[:500]}")
        return r.json() if r.content else None

    def trigger_run(self, dag_id: str, timeout_s: float = 180) -> str:
        """Once the DAG is parsed: unpause it and start a manual run; its run id."""
        wait_for(
            f"DAG {dag_id} to be parsed", lambda: self.get(f"/api/v2/dags/{dag_id}", ok404=True), timeout_s
        )
        self.set_paused(dag_id, False)
        return self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})["dag_run_id"]

    def task_state(self, dag_id: str, run_id: str, task_id: str) -> str | None:
        return next(
            (t["state"] for t in self.task_instances(dag_id, run_id) if t["task_id"] == task_id), None
        )

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns", limit=100, order_by="-run_after")["dag_runs"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task instance's log as the API returns it (JSON text: search it for strings)."""
        r = self._request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        if not r.ok:
            raise HarnessError(f"log of {dag_id}/{run_id}/{task_id}: {r.status_code} {r.text[:500]}")
        return r.text

    def clear_run(self, dag_id: str, run_id: str) -> None:
        self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/clear", {"dry_run": False})

    def set_variable(self, key: str, value: str) -> None:
        r = self._request("PATCH", f"/api/v2/variables/{key}", json={"key": key, "value": value})
        if r.status_code == 404:
            self.call("POST", "/api/v2/variables", {"key": key, "value": value})
        elif not r.ok:
            raise HarnessError(f"PATCH variable {key}: {r.status_code} {r.text[:500]}")

    def active_runs(self, dag_ids: Iterable[str]) -> list[tuple[str, str]]:
        return [
            (d, r["dag_run_id"])
            for d in dag_ids
            for r in self.dag_runs(d)
            if r["state"] in ("queued", "running")
        ]

    def quiesce(self, p: PipelineConfig, timeout_s: float = 240) -> None:
        """Stop the pipeline: pause its DAGs, let the tasks already running end, then mark the runs
        left behind failed (a paused DAG's runs are not scheduled: their remaining tasks would wait)."""
        dag_ids = (p.ingest_dag_id, p.replay_dag_id)
        for d in dag_ids:
            self.set_paused(d, True)

        def no_task_running() -> bool:
            return not [
                ti
                for d, run_id in self.active_runs(dag_ids)
                for ti in self.task_instances(d, run_id)
                if ti["state"] in ("running", "queued", "restarting")
            ]

        wait_for(f"the running tasks of {p.name} to end", no_task_running, timeout_s, every_s=2)
        for d, run_id in self.active_runs(dag_ids):
            self.call("PATCH", f"/api/v2/dags/{d}/dagRuns/{run_id}", {"state": "failed"})

    def tasks_running_since(self, p: PipelineConfig, before: datetime) -> list[str]:
        """The pipeline's task instances running now that started before ``before``."""
        out = []
        for d, run_id in self.active_runs((p.ingest_dag_id, p.replay_dag_id)):
            for ti in self.task_instances(d, run_id):
                if ti["state"] == "running" and ti.get("start_date"):
                    if datetime.fromisoformat(ti["start_date"].replace("Z", "+00:00")) < before:
                        out.append(f"{d}/{run_id}/{ti['task_id']}")
        return out

    def task_processes(self, dag_id: str, task_id: str) -> list[psutil.Process]:
        """Task processes of this installation running ``dag_id``/``task_id`` (their command lines
        name neither, so: the parents of JVMs, found through the supervisor's process title)."""
        out = []
        for p in self.processes():
            line = cmdline(p)
            if dag_id in line and task_id in line:
                out.append(p)
        return out

    def spark_drivers(self, app_name: str) -> list[psutil.Process]:
        """The spark-submit JVMs (the driver, client mode) running application ``app_name``."""
        return [
            p
            for p in self.processes()
            if "org.apache.spark.deploy.SparkSubmit" in cmdline(p)
            and app_name in cmdline(p)
            # spark-class first runs a short-lived launcher JVM that builds the driver's command line
            and "org.apache.spark.launcher.Main" not in cmdline(p)
        ]


# ----- checks -------------------------------------------------------------------------------------
def sink_offsets(sink: str) -> Counter:
    """(partition, offset) of every record in the sink, read with pyarrow."""
    import pyarrow.dataset as ds

    if not Path(sink).exists():
        return Counter()
    data = ds.dataset(sink, format="parquet", partitioning="hive")
    if "offset" not in data.schema.names:  # no batch committed yet
        return Counter()
    table = data.to_table(columns=["partition", "offset"])
    return Counter(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist()))


@dataclass
class Outcome:
    """What :func:`check_pipeline` found, record by record."""

    produced: int
    written: int
    missing: list[tuple[int, int]]  # not in the sink and not recorded as lost
    lost: list[tuple[int, int]]  # recorded as lost by the ledger
    duplicated: list[tuple[int, int]]
    committed_short: dict[str, tuple[int, int]]  # partition -> (committed, end)
    stuck: list[tuple[int, str]]  # (batch id, status) not finished
    statuses: Counter

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.committed_short or self.stuck)

    def summary(self) -> str:
        return (
            f"produced {self.produced}, written {self.written}, lost {len(self.lost)}, "
            f"missing {len(self.missing)} {self.missing[:5]}, duplicated {len(self.duplicated)} {self.duplicated[:5]}, "
            f"group short {self.committed_short}, stuck {self.stuck}, batches {dict(self.statuses)}"
        )


def lost_offsets(ledger: Ledger, pipeline: str) -> set[tuple[int, int]]:
    """(partition, offset) of every offset the ledger recorded as lost for the pipeline."""
    return {
        (s.partition, o)
        for b in ledger.losses(pipeline, 100_000)
        for s in b.spans
        for o in range(s.from_offset, s.until_offset)
    }


def check_pipeline(
    p: PipelineConfig, ledger_url: str, bootstrap: str, seen: Counter | None = None
) -> Outcome:
    """Every offset of the topic in the sink exactly once or recorded as lost by the ledger, the
    consumer group committed to the end of every partition, no batch unfinished. ``seen``: the
    sink's (partition, offset) counts when it is not a local Parquet directory."""
    with KafkaOffsets({"bootstrap.servers": bootstrap}) as k:
        tps = k.partitions(p.topics)
        ends = k.latest_offsets(tps)
        starts = k.earliest_offsets(tps)
        committed = k.committed_offsets(p.group, tps)
    ledger = Ledger(ledger_url)
    try:
        batches = ledger.recent_batches(p.name, 100_000)
        lost = lost_offsets(ledger, p.name)
    finally:
        ledger.dispose()
    if seen is None:
        seen = sink_offsets(p.sink)
    expected = {(tp.partition, o) for tp in tps for o in range(starts[tp], ends[tp])}
    return Outcome(
        produced=len(expected),
        written=sum(seen.values()),
        missing=sorted(expected - set(seen) - lost),
        lost=sorted(lost),
        duplicated=sorted(k for k, n in seen.items() if n > 1),
        committed_short={
            str(tp): (committed.get(tp, -1), ends[tp]) for tp in tps if committed.get(tp, -1) < ends[tp]
        },
        stuck=[(b.batch_id, b.status) for b in batches if b.status in (*IN_FLIGHT, "failed")],
        statuses=Counter(b.status for b in batches),
    )


def produced_end(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    with KafkaOffsets({"bootstrap.servers": bootstrap}) as k:
        return k.latest_offsets(k.partitions([topic]))


def wait_until_consistent(
    standalone: Standalone,
    p: PipelineConfig,
    ledger_url: str,
    bootstrap: str,
    timeout_s: float,
    sink_positions: Callable[[], Counter] | None = None,
) -> tuple[Outcome, float]:
    """Poll :func:`check_pipeline` until it holds (the pipeline recovered); returns the outcome and
    the seconds it took. On timeout: the last outcome, with the DAG runs' states in the error."""
    started = time.monotonic()
    last: list[Outcome] = []

    def consistent() -> bool:
        seen = sink_positions() if sink_positions is not None else None
        last[:] = [check_pipeline(p, ledger_url, bootstrap, seen)]
        return last[0].ok

    try:
        # the ledger may not exist yet, or be restarting: not consistent yet
        wait_for(
            f"pipeline {p.name} to hold every record exactly once",
            consistent,
            timeout_s,
            every_s=3,
            transient=(Exception,),
        )
    except HarnessError as e:
        runs = {
            d: [(r["dag_run_id"], r["state"]) for r in standalone.dag_runs(d)[:6]]
            for d in (p.ingest_dag_id, p.replay_dag_id)
        }
        raise HarnessError(f"{e}: {last[0].summary() if last else 'no check ran'}; runs {runs}") from None
    return last[0], time.monotonic() - started
