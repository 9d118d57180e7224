"""Run the shipped DAG file under a real Airflow (SQLite metadata DB) with ``dag.test()``.

Connections come from environment variables (the Kafka provider's format for Kafka, the Spark
provider's for Spark, a SQLAlchemy URL for the ledger); the pipelines file is written by the test
and the shipped ``dags/kafka_backpressure_pipelines.py`` builds the DAGs from it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.config.pipeline import PipelineConfig

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "kafka_backpressure_pipelines.py"
BASE_DATE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def reset_airflow_db() -> None:
    from airflow.utils.db import resetdb

    resetdb()


def set_connections(
    monkeypatch,
    bootstrap: str,
    ledger_url: str,
    spark_master: str = "local[2]",
    connect_url: str | None = None,
    kafka_extra: dict[str, str] | None = None,
) -> None:
    """``kafka_extra``: the ``kafka_default`` connection's extra (default: ``bootstrap.servers`` only)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT",
        json.dumps({"conn_type": "kafka", "extra": kafka_extra or {"bootstrap.servers": bootstrap}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps(
            {
                "conn_type": "spark",
                "host": spark_master,
                "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
            }
        ),
    )
    if connect_url:  # sc://host:port, the Spark provider's spark_connect connection
        host, _, port = connect_url.rpartition(":")
        monkeypatch.setenv(
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT",
            json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)}),
        )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_LEDGER_TEST",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": ledger_url}}),
    )


def install_pipelines(monkeypatch, pipelines: list[PipelineConfig]) -> None:
    dags_folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    dags_folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DAG_FILE, dags_folder / DAG_FILE.name)
    pipelines_file = dags_folder.parent / "pipelines.json"
    pipelines_file.write_text(json.dumps({"pipelines": [p.to_dict() for p in pipelines]}))
    monkeypatch.setenv("KBP_PIPELINES_FILE", str(pipelines_file))


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)


@dataclass
class RunResult:
    run_id: str
    state: str
    task_states: dict[str, str]
    xcoms: dict[str, Any]


def logical_date(n: int, interval_s: float = 60) -> datetime:
    """The logical date of :func:`run_dag`'s run number ``n``."""
    return BASE_DATE + timedelta(seconds=interval_s * n)


def run_dag(dag_id: str, n: int, interval_s: float = 60) -> RunResult:
    """``dag.test()`` for logical date number ``n``: the same ``n`` gives the same run id, so running
    it again is a cleared, re-run DAG run."""
    dag = load_dag(dag_id)
    when = logical_date(n, interval_s)
    dr = dag.test(logical_date=when, run_after=when)
    states, xcoms = {}, {}
    for ti in dr.get_task_instances():
        states[ti.task_id] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)
        xcoms[ti.task_id] = ti.xcom_pull(task_ids=ti.task_id)
    return RunResult(dr.run_id, str(getattr(dr.state, "value", dr.state)), states, xcoms)


def sink_asset_events(pipeline: PipelineConfig) -> list[tuple[str | None, dict]]:
    """The pipeline's sink Asset events in the order they were recorded: each one's partition key
    (the batch id) and extra (``{"batches": {...}, ...}``); none while the Asset does not exist."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from airflow_kafka_backpressure.operators.assets import sink_asset_name

    with create_session() as session:
        asset = session.query(AssetModel).filter_by(name=sink_asset_name(pipeline.name)).one_or_none()
        if asset is None:
            return []
        events = session.query(AssetEvent).filter_by(asset_id=asset.id).order_by(AssetEvent.id)
        return [(e.partition_key, dict(e.extra or {})) for e in events]


def variable(key: str) -> Any:
    from airflow.models import Variable

    value = Variable.get(key, default_var=None)
    return None if value is None else json.loads(value)


def set_variable(key: str, value: str) -> None:
    from airflow.models import Variable

    Variable.set(key, value)


def _pipeline_name(topic: str) -> str:
    t = topic.replace("-", "_")
    return t if len(t) <= 60 else f"{t[:53]}_{t[-6:]}"


def pipeline_maker(
    monkeypatch,
    bootstrap: str,
    topic: str,
    tmp_path: Path,
    spark_master: str = "local[2]",
    connect_url: str | None = None,
    kafka_extra: dict[str, str] | None = None,
    **defaults,
):
    """Connections for the test's broker (``kafka_extra``: the Kafka connection's extra, e.g. the
    secured listener's properties; ``bootstrap`` creates the topic), Spark master (and Spark Connect
    server, for ``engine="connect"``) and a SQLite ledger in ``tmp_path``, a 4-partition ``topic``, and a
    function that installs a pipeline (defaults + overrides) as the shipped DAG file's pipelines
    file and returns it with its ledger."""
    from airflow_kafka_backpressure.ledger import Ledger
    from kbp_local.producer import ensure_topic

    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    set_connections(
        monkeypatch,
        bootstrap,
        ledger_url,
        spark_master=spark_master,
        connect_url=connect_url,
        kafka_extra=kafka_extra,
    )
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the Spark driver imports the test transforms
    ensure_topic(bootstrap, topic, 4)
    base = {
        # unique per test instance (the topic's random suffix kept): two pipelines of one name with
        # different sinks would make Airflow see two URIs for one sink Asset and refuse the second
        "name": _pipeline_name(topic),
        "topics": (topic,),
        "sink": str(tmp_path / "sink"),
        "batch_interval_s": 60,
        "ledger_conn_id": "kbp_ledger_test",
        # reader "auto": Spark's format("kafka"), the connector being in the session's SPARK_CONF_DIR
        "stall_timeout_s": 30,
        **defaults,
    }

    def make(**overrides) -> tuple[PipelineConfig, Ledger]:
        p = PipelineConfig(**{**base, **overrides})
        install_pipelines(monkeypatch, [p])
        return p, Ledger(ledger_url)

    return make


def engine_pipeline_maker(request, engine: str, monkeypatch, bootstrap: str, topic: str, tmp_path: Path):
    """:func:`pipeline_maker` for ``engine``: ``connect`` on the session's Spark Connect server (the
    ``spark_connect`` fixture, started on first use), ``submit`` on ``local[2]``."""
    connect_url = request.getfixturevalue("spark_connect").url if engine == "connect" else None
    return pipeline_maker(monkeypatch, bootstrap, topic, tmp_path, connect_url=connect_url, engine=engine)


def spec_dag_source(dag_id: str, spec_env: str, imports: str, tasks: str) -> str:
    """The text of a DAG file for ``dag_id`` whose tasks are built from the JSON in env ``spec_env``
    (as ``spec``); the DAG exists only while that variable is set, so tests can vary it per run."""
    body = "\n".join("        " + line for line in tasks.strip().splitlines())
    return (
        "import json, os\nfrom datetime import datetime\nfrom airflow.sdk import DAG\n"
        f"{imports.strip()}\n\n"
        f"spec = os.environ.get({spec_env!r})\n"
        "if spec:\n"
        "    spec = json.loads(spec)\n"
        f"    with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:\n"
        f"{body}\n"
    )


def install_dag_file(name: str, source: str) -> Path:
    """Write a DAG file into the DAGs folder; returns its path (unlink it when done)."""
    folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(source)
    return path


def fail_replay_then_ingest(
    p: PipelineConfig, bootstrap: str, flag: Path, *, after_failure: Any = None
) -> tuple[RunResult, RunResult, RunResult]:
    """The failure-and-replay scenario of a pipeline whose transform is
    ``tests.integration.e2e_transforms:fail_while_flagged`` (``KBP_TEST_FAIL_FLAG`` = ``flag``):
    40 records produced, ingest run 0 fails while ``flag`` exists (``after_failure()`` is called
    then), the replay DAG re-runs the batch, 20 more records and ingest run 1 succeeds. Returns the
    three runs (ids 0..59 in the sink, in batches 1 and 2)."""
    from kbp_local.producer import produce

    produce(bootstrap, p.topics[0], count=40, partitions=4)
    flag.touch()
    failed = run_dag(p.ingest_dag_id, 0)
    assert failed.task_states["ingest"] == "failed", failed.task_states
    if after_failure is not None:
        after_failure(failed)
    flag.unlink()
    replay = run_dag(p.replay_dag_id, 0)
    assert replay.state == "success", replay.task_states
    produce(bootstrap, p.topics[0], count=20, partitions=4, start_id=40)
    ok = run_dag(p.ingest_dag_id, 1)
    assert ok.state == "success", ok.task_states
    return failed, replay, ok
