"""Fixtures of the fault suite: one ``airflow standalone`` for the suite's tests (package scope: it
and its servers stop after the last of them, not at the session's end), serving one pipeline per
scenario (paused until its test unpauses it), a broker of its own (tests freeze it), a SQLite ledger
and a PostgreSQL server of its own for the ledger-outage scenario (it is stopped and restarted).

The pipelines read Kafka as production does: through the broker's SASL_SSL listener, as a SCRAM
user whose password (:attr:`FaultRig.kafka_password`, random) is searched for afterwards in what the
scheduler, triggerer, DAG processor, API server and tasks wrote (test_process_faults.py)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
import pytest

from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.ledger import Ledger
from kbp_local.apache_kafka import KafkaBroker
from kbp_local.jars import combined_spark_conf, spark_delta_conf, spark_s3a_conf
from kbp_local.producer import ensure_topic, produce
from kbp_local.s3 import S3Server
from tests.faults.pause_point import PAUSE_DIR_ENV as PAUSE_AFTER_COMMIT_DIR_ENV

from ..fixtures_postgres import LocalPostgres, PostgresUnavailable
from .harness import Outcome, Standalone, check_pipeline, sink_offsets, wait_for, wait_until_consistent

TMP_ROOT = Path(__file__).resolve().parents[2] / ".tmp"
SCENARIOS = (
    "driver_kill",
    "swap_kill",
    "scheduler_kill",
    "broker_freeze",
    "pg_outage",
    "retention",
    "cleared_run",
    "backfill",
    "plan_kill",
    "partitions_added",
    "topic_recreated",
    "s3_restart",
)
#: The retention scenario's batch fails while its flag file exists; a lost offset is skipped, recorded.
SCENARIO_OVERRIDES = {
    "retention": dict(on_data_loss="skip", transform="tests.integration.e2e_transforms:fail_while_flagged"),
    "topic_recreated": dict(on_topic_reset="earliest"),
}
PARTITIONS = 2
S3_BUCKET = "faults"
#: Short intervals: a batch every 15 s, a replay look every 20 s, leases of 20 s.
PIPELINE_DEFAULTS = dict(
    batch_interval_s=15,
    replay_interval_s=20,
    lease_s=20,
    stall_timeout_s=20,
    batch_timeout_s=480,
    driver_memory="512m",
)
#: The first batch takes the backlog (few batches per scenario: a batch takes 20 s to minutes here).
SETTINGS = json.dumps({"min_rate": 5, "max_records_per_batch": 1000})
#: How long a scenario may take to converge after its fault (the machine is shared and slow).
RECOVER_TIMEOUT_S = float(os.environ.get("KBP_FAULTS_RECOVER_TIMEOUT_S", "900"))
#: How long one step may take (a batch reaching its Spark job, its sink commit).
STEP_TIMEOUT_S = 600.0
#: The SCRAM user the fault suite's pipelines read Kafka as.
KAFKA_USER = "kbp-faults"
#: The fault suite's module that needs no rig (it runs first: pytest_collection_modifyitems).
SOAK_MODULE = "test_short_soak.py"


def _in_fault_suite(item: pytest.Item) -> bool:
    return "/faults/" in str(item.fspath)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_fault_suite(item):
            item.add_marker(pytest.mark.faults)
    # The short soak brings its own Airflow, broker and ledger (bench/soak.py): it runs before the
    # rig's tests, so that the rig is not running beside it, and the rig stops with the package's
    # last test. At rest the rig took a quarter to two thirds of a core (its scheduler, DAG processor
    # re-parsing 13 pipelines, triggerer, broker): as a session fixture it idled through the whole
    # rest of its shard (62 minutes of the 2026-11-30 evening rehearsal).
    soak = [i for i in items if _in_fault_suite(i) and i.path.name == SOAK_MODULE]
    if soak:
        rest = [i for i in items if i not in soak]
        first = next((n for n, i in enumerate(rest) if _in_fault_suite(i)), len(rest))
        items[:] = rest[:first] + soak + rest[first:]


@pytest.fixture
def rig(fault_rig: FaultRig) -> Iterator[FaultRig]:
    """The session's rig; a pipeline a test started is stopped after it, whatever happened. A test
    starts with a running scheduler, whatever the one before it did to Airflow's."""
    fault_rig.standalone.revive_scheduler()
    yield fault_rig
    for p in list(fault_rig.started):
        fault_rig.stop(p)


@dataclass
class FaultRig:
    standalone: Standalone
    broker: KafkaBroker
    postgres: LocalPostgres
    pipelines: dict[str, PipelineConfig]
    ledger_urls: dict[str, str]
    pause_dir: Path
    root: Path
    #: the password of the pipelines' Kafka user: it must show up nowhere the suite can read
    kafka_password: str = ""
    #: the S3 server of the s3_restart scenario's Delta table (the tests restart it)
    s3: S3Server | None = None
    started: list[PipelineConfig] = field(default_factory=list)

    @property
    def fail_flag(self) -> Path:
        """While this file exists, the retention scenario's batches fail (its transform raises)."""
        return self.root / "fail.flag"

    def pipeline(self, scenario: str) -> PipelineConfig:
        return self.pipelines[scenario]

    def produce(self, p: PipelineConfig, count: int, start_id: int) -> int:
        return produce(
            self.broker.bootstrap, p.topics[0], count=count, partitions=PARTITIONS, start_id=start_id
        )

    def start(self, p: PipelineConfig, replay: bool = True) -> None:
        self.started.append(p)
        self.standalone.set_paused(p.ingest_dag_id, False)
        if replay:
            self.standalone.set_paused(p.replay_dag_id, False)

    def wait_for_spark(self, p: PipelineConfig) -> list[psutil.Process]:
        """Until a Spark driver of one of the pipeline's batches runs: the drivers' processes."""
        return wait_for(
            "a Spark driver of the pipeline",
            lambda: self.standalone.spark_drivers(f"kbp-{p.name}-batch-"),
            STEP_TIMEOUT_S,
            every_s=0.5,
        )

    def ledger(self, p: PipelineConfig) -> Ledger:
        return Ledger(self.ledger_urls[p.name])

    def sink_positions(self, p: PipelineConfig) -> Counter:
        """(partition, offset) of every record in the pipeline's sink: a Parquet directory read with
        pyarrow, or a Delta table on the S3 server read from its log (tests.integration's reader)."""
        if p.sink_format != "delta":
            return sink_offsets(p.sink)
        from tests.integration.test_delta_pipeline import Table, table_rows

        assert self.s3 is not None and p.sink.startswith("s3a://")
        table = Table(p.sink, self.s3.filesystem(), p.sink.removeprefix("s3a://"), {})
        if not table.exists("_delta_log"):
            return Counter()
        return Counter((r["partition"], r["offset"]) for r in table_rows(table))

    def check(self, p: PipelineConfig) -> Outcome:
        return check_pipeline(p, self.ledger_urls[p.name], self.broker.bootstrap, self.sink_positions(p))

    def recover(self, p: PipelineConfig, timeout_s: float = RECOVER_TIMEOUT_S) -> tuple[Outcome, float]:
        """Wait until the pipeline holds every record exactly once (its outcome and how long that took),
        then stop it."""
        try:
            return wait_until_consistent(
                self.standalone,
                p,
                self.ledger_urls[p.name],
                self.broker.bootstrap,
                timeout_s,
                sink_positions=lambda: self.sink_positions(p),
            )
        finally:
            self.stop(p)

    def assert_recovered(self, p: PipelineConfig, produced: int, fault: str) -> Outcome:
        """:meth:`recover`, then: nothing lost (none of these faults may lose data), nothing twice,
        every produced record in the sink, the group at the end, no batch left unfinished."""
        outcome, took = self.recover(p)
        assert outcome.ok, outcome.summary()
        assert not outcome.lost, outcome.summary()
        assert outcome.written == produced, outcome.summary()
        print(f"{fault}: recovered in {took:.0f}s; batches {dict(outcome.statuses)}")
        return outcome

    def stop(self, p: PipelineConfig) -> None:
        if p in self.started:
            self.started.remove(p)
            self.standalone.quiesce(p)


def make_pipelines(
    root: Path, names: tuple[str, ...], pg: bool
) -> tuple[dict[str, PipelineConfig], dict[str, str], dict]:
    sqlite_url = f"sqlite:///{root / 'ledger.db'}"
    pipelines, urls = {}, {}
    for name in names:
        conn_id = "kbp_ledger_pg" if (pg and name == "pg_outage") else "kbp_ledger_faults"
        pipelines[name] = PipelineConfig(
            name=f"f_{name}",
            topics=(f"faults-{name}-{secrets.token_hex(2)}",),
            sink=str(root / "sinks" / name),
            ledger_conn_id=conn_id,
            **{**PIPELINE_DEFAULTS, **SCENARIO_OVERRIDES.get(name, {})},
        )
        urls[pipelines[name].name] = sqlite_url
    return pipelines, urls, {"kbp_ledger_faults": sqlite_url}


def connections(
    bootstrap: str, ledgers: dict[str, str], kafka_extra: dict[str, str] | None = None
) -> dict[str, dict]:
    """The rig's Airflow connections; ``kafka_extra`` (the official provider's client properties,
    SASL settings included) replaces the plain ``bootstrap.servers``."""
    conns = {
        "kafka_default": {"conn_type": "kafka", "extra": kafka_extra or {"bootstrap.servers": bootstrap}},
        "spark_default": {
            "conn_type": "spark",
            "host": "local[2]",
            "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
        },
    }
    for conn_id, url in ledgers.items():
        conns[conn_id] = {"conn_type": "generic", "extra": {"sqlalchemy_url": url}}
    return conns


@pytest.fixture(scope="package")
def fault_rig(request: pytest.FixtureRequest, spark_kafka_connector: str) -> Iterator[FaultRig]:
    root = TMP_ROOT / f"faults-{os.getpid()}"
    root.mkdir(parents=True)
    # a SIGTERM (a CI timeout, kill PID) unwinds like Ctrl-C, so the teardown below stops everything
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    broker = KafkaBroker(root / "kafka", secured=True).start()
    kafka_password = f"kbp-fault-planted-{secrets.token_hex(12)}"
    postgres = LocalPostgres(root / "pg")
    s3 = S3Server(root / "s3")
    standalone = None
    try:
        try:
            postgres.start()
            pg_ok = True
        except PostgresUnavailable:
            if os.environ.get("KBP_SKIP_POSTGRES") != "1":
                raise
            pg_ok = False
        pipelines, urls, ledgers = make_pipelines(root, SCENARIOS, pg_ok)
        # the S3 restart scenario writes a Delta table on the rig's own S3 server (restarted by its test)
        s3.start()
        s3.create_bucket(S3_BUCKET)
        pipelines["s3_restart"] = replace(
            pipelines["s3_restart"],
            sink=f"s3a://{S3_BUCKET}/s3_restart",
            sink_format="delta",
            spark_conf=combined_spark_conf(
                spark_delta_conf(jars="extraClassPath"), spark_s3a_conf(s3, jars="extraClassPath")
            ),
        )
        if pg_ok:
            pg_url = postgres.url
            ledgers["kbp_ledger_pg"] = pg_url
            urls[pipelines["pg_outage"].name] = pg_url
        for p in pipelines.values():
            ensure_topic(broker.bootstrap, p.topics[0], PARTITIONS)
        broker.add_scram_user(KAFKA_USER, kafka_password)
        pause_dir = root / "pause"
        pause_dir.mkdir()
        standalone = Standalone(
            root / "airflow",
            list(pipelines.values()),
            connections(
                broker.bootstrap, ledgers, broker.secured_client_properties(KAFKA_USER, kafka_password)
            ),
            dag_files=[Path(__file__).with_name("dags") / "kbp_faults_lag_watch.py"],
            extra_env={
                PAUSE_AFTER_COMMIT_DIR_ENV: str(pause_dir),
                "KBP_TEST_FAIL_FLAG": str(root / "fail.flag"),
                "SPARK_LOCAL_DIRS": str(root / "spark"),
                **s3.aws_environment(),  # the tasks' side of the S3 sink (pyarrow), as a user sets it
            },
        ).start()
        for p in pipelines.values():
            standalone.set_variable(p.settings_variable, SETTINGS)
        yield FaultRig(standalone, broker, postgres, pipelines, urls, pause_dir, root, kafka_password, s3)
    finally:
        if standalone is not None:
            standalone.stop()
        broker.stop()
        postgres.stop()
        s3.stop()
        signal.signal(signal.SIGTERM, previous)
        if not request.session.testsfailed:  # else kept: the logs of Airflow, its tasks, the broker
            shutil.rmtree(root, ignore_errors=True)
