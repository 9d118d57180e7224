"""Planted secrets never leave the places they were put (the connections, a secret file on the
hosts and the pipeline's Spark settings), after real batches — a failed one, its replay and a
successful one — through the shipped DAGs under real Airflow (``dag.test()``), the real broker, a real
PostgreSQL ledger whose role has a password, on **both engines and both readers**: real
``spark-submit``, and a real Spark Connect server (its own, for this module: its UI, event log and
token are what is searched).

The secrets:

* the Kafka connection's ``sasl.password`` (a SCRAM user's of the session broker's SASL_SSL listener,
  the only one the pipeline is given). The connect engine with Spark's own reader gets it as a
  reference to a file on the hosts (``${dir:…}``: Spark's connector reads credentials only from its
  options or the Spark hosts, and the connect engine puts none in a plan); every other variant as a
  value in the connection;
* the ledger database's password;
* submit engine: the Spark settings ``spark.hadoop.fs.s3a.secret.key`` and
  ``spark.hadoop.fs.s3a.encryption.key`` (the latter outside Spark's redaction pattern);
* connect engine: the Spark Connect server's token (the ``spark_connect`` connection's password),
  which the server requires.

Everything reachable afterwards is searched for each:

* the command line of every process seen while the batches ran (``spark-submit``, its JVM, Python
  workers, the Connect server — sampled from /proc; the sampler must have seen the engine's process);
* the task logs (the output of the in-process task runner) and any log file under AIRFLOW_HOME;
* every row of every ledger table (the error column of the failed batch included);
* the monitoring API's JSON (batches, replayable batches, lag, ledger description) as its views build it;
* the serialized kwargs of the pipeline's triggers (failed ranges, lag) and the whole Airflow metadata
  database file (trigger table, XComs, rendered template fields, Variables);
* every file left under the sink (its ``_kbp`` hand-off dir included), the test's directory (the
  submit engine's Spark event logs of the three applications included) and AIRFLOW_HOME (the
  worker's scratch and package dirs, the kept Connect sessions), except the pipelines file and the
  secret file the test wrote;
* every version of every file under the hand-off directory seen while the jobs ran (sampled every
  0.1 s: the sealed spec, the metrics, the error);
* connect engine: the Connect server's Spark UI (every page reachable from its root, the Connect
  tab's sessions and statements and the SQL tab's plans among them), its REST API
  (``/api/v1/applications/…``: jobs, stages, SQL executions with their plans, environment), its
  event log and its own log.
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
S3_ENCRYPTION_KEY = f"s3Sse{TOKEN}"
CONNECT_TOKEN = f"connectToken{TOKEN}"


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture
def secret_ledger_url(postgres_url):
    """A schema of the session's PostgreSQL owned by a role whose password is DB_SECRET (a new role and
    schema per test: the ledger hook keeps what it learnt of a database per URL)."""
    suffix = secrets.token_hex(4)
    role, schema = f"kbp_role_{suffix}", f"kbp_secret_{suffix}"
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


@pytest.fixture(scope="module")
def watched_connect_server(spark_kafka_connector):
    """A Spark Connect server for this module, with its UI and event log on and a token required."""
    from kbp_local.process import free_port
    from kbp_local.spark_connect import SparkConnectServer
    from tests.conftest import TMP_ROOT
    from tests.local_servers import served

    root = TMP_ROOT / f"spark-connect-watched-{os.getpid()}-{secrets.token_hex(3)}"
    events = root / "events"
    events.mkdir(parents=True)
    server = SparkConnectServer(
        root,
        conf={
            "spark.ui.enabled": "true",
            "spark.ui.port": str(free_port("127.0.0.1")),
            **plain_event_log(events),
        },
        token=CONNECT_TOKEN,
    )
    server.events = events  # type: ignore[attr-defined]
    yield from served(server, root)


def plain_event_log(directory: Path) -> dict[str, str]:
    """Spark settings for an event log in ``directory`` whose text the search can read: Spark 4
    compresses event logs (zstd) by default, in which no planted string would ever be found."""
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(directory),
        "spark.eventLog.compress": "false",
    }


def assert_searchable_event_logs(directory: Path) -> None:
    """The event logs under ``directory`` are there and plain JSON lines (so a search can find text)."""
    logs = files_under(directory, set())
    assert any(b'"Event":"SparkListenerApplicationStart"' in data for data in logs.values()), sorted(logs)


VARIANTS = [("submit", "native"), ("submit", "python"), ("connect", "native"), ("connect", "python")]


@pytest.mark.parametrize("engine,reader", VARIANTS, ids=[f"{e}-{r}" for e, r in VARIANTS])
def test_planted_secrets_reach_no_command_line_log_ledger_row_api_trigger_file_or_spark_ui(
    engine,
    reader,
    request,
    kafka_broker,
    topic_name,
    tmp_path,
    monkeypatch,
    airflow_db,
    secret_ledger_url,
    capfd,
):
    # the pipeline reads only the broker's SASL/SCRAM-over-TLS listener, as a user whose password
    # is KAFKA_SECRET: planning, Spark's reader, the group commit and the triggers all log in with it
    kafka_broker.add_scram_user(f"kbp-{TOKEN}", KAFKA_SECRET)
    kafka_extra = kafka_broker.secured_client_properties(f"kbp-{TOKEN}", KAFKA_SECRET)
    kept_out = set()  # files that hold a secret by design
    if (engine, reader) == ("connect", "native"):
        secret_dir = tmp_path / "host-secrets"
        secret_dir.mkdir()
        (secret_dir / "kafka-password").write_text(KAFKA_SECRET)
        kafka_extra["sasl.password"] = f"${{dir:{secret_dir}:kafka-password}}"
        kept_out.add((secret_dir / "kafka-password").resolve())
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_SECRET_KAFKA", json.dumps({"conn_type": "kafka", "extra": kafka_extra})
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_SECRET_LEDGER",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": secret_ledger_url}}),
    )
    flag = tmp_path / "fail-now"
    monkeypatch.setenv("KBP_TEST_FAIL_FLAG", str(flag))
    event_log = tmp_path / "spark-events"
    event_log.mkdir()
    planted = {"sasl.password": KAFKA_SECRET, "ledger password": DB_SECRET}
    server = None
    if engine == "connect":
        server = request.getfixturevalue("watched_connect_server")
        planted["Spark Connect token"] = CONNECT_TOKEN
        spark_conf: dict[str, str] = {}
    else:
        planted.update({"fs.s3a.secret.key": S3_SECRET, "fs.s3a.encryption.key": S3_ENCRYPTION_KEY})
        spark_conf = {
            "spark.hadoop.fs.s3a.secret.key": S3_SECRET,
            "spark.hadoop.fs.s3a.access.key": "AKIAEXAMPLE",
            "spark.hadoop.fs.s3a.encryption.key": S3_ENCRYPTION_KEY,  # outside Spark's redaction pattern
            # Spark's event log (every setting and environment entry the application saw), searched below
            **plain_event_log(event_log),
        }
    make = af.pipeline_maker(monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path)
    if server is not None:  # the Spark provider's connection: the token is its password
        monkeypatch.setenv(
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
            json.dumps(
                {
                    "conn_type": "spark_connect",
                    "host": "sc://localhost",
                    "port": server.port,
                    "password": CONNECT_TOKEN,
                }
            ),
        )
    p, _ = make(
        engine=engine,
        reader=reader,
        kafka_conn_id="kbp_secret_kafka",
        ledger_conn_id="kbp_secret_ledger",
        spark_conf=spark_conf,
        transform="tests.integration.e2e_transforms:fail_while_flagged",
        replay_interval_s=20,
    )
    capfd.readouterr()

    with CommandLines(Path(p.sink) / "_kbp") as procs:
        af.fail_replay_then_ingest(p, kafka_broker.bootstrap, flag)
    out, err = capfd.readouterr()
    assert sorted(sink_ids(p.sink)) == list(range(60))  # the batches really ran
    readers = {json.loads(m.read_text())["reader"] for m in Path(p.sink).glob("batch_id=*/_manifest.json")}
    assert readers == {reader}, readers  # with the reader asked for
    if engine == "submit":
        assert any("spark-submit" in c or "SparkSubmit" in c for c in procs.seen), (
            "no spark-submit was sampled"
        )
        # the hand-off files were seen while the jobs ran (the sealed spec, then the metrics or error)
        assert any("spec.json" in name for name in procs.handoff_files), sorted(procs.handoff_files)
        event_logs = list(event_log.iterdir())
        assert len(event_logs) >= 3, event_logs  # one per application: the failed batch, its replay, the next
        assert_searchable_event_logs(event_log)
    else:
        assert any("SparkConnectServer" in c for c in procs.seen), "the Connect server was not sampled"

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
    kept_out.add(pipelines_file)
    for path, data in {**files_under(tmp_path, kept_out), **files_under(home, kept_out)}.items():
        places[f"file {path}"] = data  # Spark's event logs (under tmp_path) included
    for name, data in procs.handoff_files.items():
        places[f"hand-off file {name}, while a job ran"] = data
    assert f"file {home / 'airflow.db'}" in places  # the metadata DB (trigger table, XComs) is searched
    if server is not None:
        places.update(connect_server_places(server))

    # the search sees a secret where one is: the pipelines file the test wrote holds the Spark settings
    if engine == "submit":
        assert S3_SECRET.encode() in pipelines_file.read_bytes()
    leaks = [
        f"{what} found in {where}"
        for where, content in places.items()
        for what, secret in planted.items()
        if (secret.encode() if isinstance(content, bytes) else secret) in content
    ]
    assert not leaks, "\n".join(leaks)


def connect_server_places(server) -> dict[str, str | bytes]:
    """What the Spark Connect server shows and keeps: every page of its Spark UI reachable from the
    root (the Connect tab's sessions and statements, the SQL tab's plans), its REST API's applications,
    jobs, stages, SQL executions (with plan descriptions) and environment, its event log and its own
    log. Asserts the UI showed the batches' statements, so an empty crawl cannot pass."""
    import re
    import urllib.request
    from urllib.parse import urljoin, urlparse

    def get(url: str) -> str:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.read().decode(errors="replace")

    ui = f"http://127.0.0.1:{server.conf['spark.ui.port']}"
    places: dict[str, str | bytes] = {}
    seen, todo = set(), [f"{ui}/"]
    while todo and len(seen) < 400:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        try:
            page = get(url)
        except Exception as e:  # noqa: BLE001 - a page that errs is named, not searched
            places[f"Spark UI {url} (error)"] = str(e)
            continue
        places[f"Spark UI {url}"] = page
        for href in re.findall(r'href="([^"#]+)"', page):
            link = urljoin(url, href.replace("&amp;", "&"))
            parsed = urlparse(link)
            if (
                link.startswith(ui)
                and "kill" not in parsed.path
                and not parsed.path.endswith((".js", ".css", ".png", ".ico"))
            ):
                todo.append(link)
    connect_pages = [u for u in places if "/connect/" in u]
    assert connect_pages, sorted(places)[:20]
    apps = json.loads(get(f"{ui}/api/v1/applications"))
    places["REST applications"] = json.dumps(apps)
    for app in apps:
        base = f"{ui}/api/v1/applications/{app['id']}"
        for endpoint in (
            "jobs",
            "stages?details=true",
            "sql?details=true&planDescription=true",
            "environment",
            "executors",
        ):
            places[f"REST {base}/{endpoint}"] = get(f"{base}/{endpoint}")
    statements = places[
        f"REST {ui}/api/v1/applications/{apps[0]['id']}/sql?details=true&planDescription=true"
    ]
    assert "kbp_kafka_ranges" in statements or "kafka" in statements.lower()  # the batches' plans are there
    assert_searchable_event_logs(server.events)
    for path, data in files_under(server.events, set()).items():
        places[f"Connect server event log {path}"] = data
    places["Connect server log"] = server.log_path.read_bytes()
    return places
