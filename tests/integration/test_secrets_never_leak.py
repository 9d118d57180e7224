"""Planted secrets never leave the places they were put (the connections and the pipeline's Spark
settings), after real batches — a failed one, its replay and a successful one — through the shipped
DAGs under real Airflow (``dag.test()``), the real broker, real ``spark-submit`` and a real PostgreSQL
ledger whose role has a password.

Three secrets: the Kafka connection's ``sasl.password`` (a SCRAM user's of the session broker's
SASL_SSL listener, the only one the pipeline is given), the Spark setting
``spark.hadoop.fs.s3a.secret.key`` and the ledger database's password. Everything reachable afterwards
is searched for each:

* the command line of every process seen while the batches ran (``spark-submit``, its JVM, Python
  workers — sampled from /proc; the sampler must have seen ``spark-submit``);
* the task logs (the output of the in-process task runner) and any log file under AIRFLOW_HOME;
* every row of every ledger table (the error column of the failed batch included);
* the monitoring API's JSON (batches, replayable batches, lag, ledger description) as its views build it;
* the serialized kwargs of the pipeline's triggers (failed ranges, lag) and the whole Airflow metadata
  database file (trigger table, XComs, rendered template fields, Variables);
* every file left under the sink (its ``_kbp`` hand-off dir included), the test's directory (Spark's
  event logs of the three applications included) and AIRFLOW_HOME (the worker's scratch and package
  dirs), except the pipelines file the test wrote;
* every version of every file under the hand-off directory seen while the jobs ran (sampled every
  0.1 s: the sealed spec, the metrics, the error).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, make_url, select, text

from tests.fixtures_postgres import url_with_search_path

from . import airflow_harness as af
from .test_pipeline_e2e import sink_ids

TOKEN = secrets.token_hex(6)
KAFKA_SECRET = f"kafkaPw{TOKEN}"
S3_SECRET = f"s3Secret{TOKEN}"
DB_SECRET = f"dbPw{TOKEN}"
SECRETS = {"sasl.password": KAFKA_SECRET, "fs.s3a.secret.key": S3_SECRET, "ledger password": DB_SECRET}


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def secret_ledger_url(postgres_url):
    """A schema of the session's PostgreSQL owned by a role whose password is DB_SECRET."""
    role, schema = f"kbp_role_{TOKEN}", f"kbp_secret_{TOKEN}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{DB_SECRET}'"))
        # a non-superuser with CREATEROLE (CI's role) must be a member to give it a schema and drop it
        conn.execute(text(f"GRANT {role} TO CURRENT_USER"))
        conn.execute(text(f"CREATE SCHEMA {schema} AUTHORIZATION {role}"))
    url = make_url(postgres_url).set(username=role, password=DB_SECRET)
    try:
        yield url_with_search_path(url.render_as_string(hide_password=False), schema)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


class CommandLines:
    """Samples the command line of every process on the machine while running, and the content of
    every file under ``handoff`` (the submit engine's hand-off directory, which lives only while a
    job runs)."""

    def __init__(self, handoff: Path) -> None:
        self.seen: set[str] = set()
        self.handoff = handoff
        self.handoff_files: dict[str, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for path, data in files_under(self.handoff, set()).items():
                    self.handoff_files[f"{path} ({len(data)} bytes)"] = data
            except OSError:  # a job's directory went while it was walked: the next round sees the rest
                pass
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        raw = Path(entry.path, "cmdline").read_bytes()
                    except OSError:
                        continue
                    if raw:
                        self.seen.add(raw.replace(b"\0", b" ").decode(errors="replace"))
            self._stop.wait(0.1)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def ledger_dump(url: str) -> str:
    engine = create_engine(url)
    try:
        rows = []
        with engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                for row in conn.execute(select(text("*")).select_from(text(table))):
                    rows.append(f"{table}: {tuple(row)!r}")
        return "\n".join(rows)
    finally:
        engine.dispose()


def files_under(root: Path, skip: set[Path]) -> dict[Path, bytes]:
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and path.resolve() not in skip:
            try:
                out[path] = path.read_bytes()
            except OSError:
                pass
    return out


def test_planted_secrets_reach_no_command_line_log_ledger_row_api_trigger_or_file(
    kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, secret_ledger_url, capfd
):
    # the pipeline reads only the broker's SASL/SCRAM-over-TLS listener, as a user whose password
    # is KAFKA_SECRET: planning, Spark's reader, the group commit and the triggers all log in with it
    kafka_broker.add_scram_user(f"kbp-{TOKEN}", KAFKA_SECRET)
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_SECRET_KAFKA",
        json.dumps(
            {
                "conn_type": "kafka",
                "extra": kafka_broker.secured_client_properties(f"kbp-{TOKEN}", KAFKA_SECRET),
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_SECRET_LEDGER",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": secret_ledger_url}}),
    )
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    event_log = tmp_path / "spark-events"
    event_log.mkdir()
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path)
    p, _ = make(
        kafka_conn_id="kbp_secret_kafka",
        ledger_conn_id="kbp_secret_ledger",
        spark_conf={
            "spark.hadoop.fs.s3a.secret.key": S3_SECRET,
            "spark.hadoop.fs.s3a.access.key": "AKIAEXAMPLE",
            # Spark's event log (every setting and environment entry the application saw), searched below
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(event_log),
        },
        transform="tests.integration.e2e_transforms:fail_while_flagged",
        replay_interval_s=20,
    )
    capfd.readouterr()

    with CommandLines(Path(p.sink) / "_kbp") as procs:
        af.fail_replay_then_ingest(p, kafka_broker.bootstrap, flag)
    out, err = capfd.readouterr()
    assert sorted(sink_ids(p.sink)) == list(range(60))  # the batches really ran
    assert any("spark-submit" in c or "SparkSubmit" in c for c in procs.seen), "no spark-submit was sampled"
    # the hand-off files were seen while the jobs ran (the sealed spec, then the metrics or error)
    assert any("spec.json" in name for name in procs.handoff_files), sorted(procs.handoff_files)
    event_logs = list(event_log.iterdir())
    assert len(event_logs) >= 3, event_logs  # one per application: the failed batch, its replay, the next

    from airflow_kafka_backpressure.hooks.ledger import LedgerHook
    from airflow_kafka_backpressure.plugins import views
    from airflow_kafka_backpressure.sensors.kafka_lag import KafkaLagSensor
    from airflow_kafka_backpressure.triggers.failed_ranges import FailedRangesTrigger

    ledger = LedgerHook("kbp_secret_ledger").get_conn()
    failed_batch = ledger.batch(1)
    assert failed_batch.error and "injected failure" in failed_batch.error  # the error column is filled
    monkeypatch.setenv(views.LEDGER_CONN_ENV, "kbp_secret_ledger")
    api = {
        "batches": views.batches(ledger, p.name, 100),
        "replayable": views.replayable(ledger, p.name, 1.0),
        "lag": views.lag(ledger, p.name, 0, True),
        "ledger": views.ledger_description(),
    }
    lag_sensor = KafkaLagSensor(task_id="lag", pipeline=p, max_lag_records=1)
    triggers = [
        FailedRangesTrigger(p.ledger_conn_id, p.name, None, 5.0).serialize(),
        lag_sensor.trigger(None).serialize(),
    ]

    home = Path(os.environ["AIRFLOW_HOME"])
    pipelines_file = Path(os.environ["KBP_PIPELINES_FILE"]).resolve()
    places: dict[str, str | bytes] = {
        "command lines": "\n".join(procs.seen),
        "task logs": out + err,
        "ledger rows": ledger_dump(secret_ledger_url),
        "monitoring API JSON": json.dumps(api),
        "trigger kwargs": json.dumps(triggers),
    }
    for path, data in {**files_under(tmp_path, set()), **files_under(home, {pipelines_file})}.items():
        places[f"file {path}"] = data  # Spark's event logs (under tmp_path) included
    for name, data in procs.handoff_files.items():
        places[f"hand-off file {name}, while a job ran"] = data
    assert f"file {home / 'airflow.db'}" in places  # the metadata DB (trigger table, XComs) is searched

    # the search sees a secret where one is: the pipelines file the test wrote holds the S3 key
    assert S3_SECRET.encode() in pipelines_file.read_bytes()
    leaks = [
        f"{what} found in {where}"
        for where, content in places.items()
        for what, secret in SECRETS.items()
        if (secret.encode() if isinstance(content, bytes) else secret) in content
    ]
    assert not leaks, "\n".join(leaks)
