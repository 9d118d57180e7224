"""Issue 20, item 2: the job spec's key never reaches a command line, whatever the master.

The Spark provider's own ``SparkSubmitHook`` builds each command here (it is not run): for YARN and
Kubernetes masters the hook turns ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` /
``spark.kubernetes.driverEnv.*``, so the engine must hand the key over another way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_kafka_backpressure.batch import handoff
from airflow_kafka_backpressure.batch.models import BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.engines import BatchJobError
from airflow_kafka_backpressure.engines.environment import spark_defaults
from airflow_kafka_backpressure.engines.submit import SubmitEngine

PASSWORD = "pl4nted-kafka-p4ssword"


class _Captured(SparkSubmitHook):
    """The provider's hook, stopped where it would start spark-submit: what it would run, with which
    environment, and the properties file and spec as they are at that moment."""

    seen: list[dict] = []

    def submit(self, application: str = "", **kwargs):
        cmd = self._build_spark_submit_command(application)
        props = cmd[cmd.index("--properties-file") + 1] if "--properties-file" in cmd else None
        spec_uri = cmd[cmd.index("--spec") + 1]
        env = kwargs.get("env") or {**(self._env or {})}
        self.seen.append(
            {
                "cmd": cmd,
                "masked": self._mask_cmd(cmd),
                "env": env,
                "properties": Path(props).read_text() if props else "",
                "spec": json.loads(Path(spec_uri).read_text()),
            }
        )
        return None


def _engine_and_spec(monkeypatch, tmp_path, conn_id: str, master: str, deploy_mode: str, **engine_kw):
    """A submit engine whose hook is the captured provider hook, on a ``spark`` connection of
    ``master`` and ``deploy_mode``, and a spec whose Kafka properties hold a planted password."""
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": "spark", "host": master, "extra": {"deploy-mode": deploy_mode}}),
    )
    _Captured.seen = []
    engine = SubmitEngine(
        lambda **kw: _Captured(conn_id=conn_id, **kw),
        master=master,
        deploy_mode=deploy_mode,
        work_root=tmp_path / "work",
        executors=2,
        **engine_kw,
    )
    plan = BatchPlan("p", 7, "r", (OffsetRange("t", 0, 0, 10),), str(tmp_path / "sink"), 1000, 0)
    spec = JobSpec(
        plan=plan,
        kafka={"bootstrap.servers": "b:9093", "sasl.mechanism": "SCRAM-SHA-512", "sasl.password": PASSWORD},
        launched_at_ms=1,
    )
    return engine, spec


def _submit(monkeypatch, tmp_path, conn_id: str, master: str, deploy_mode: str) -> dict:
    engine, spec = _engine_and_spec(
        monkeypatch,
        tmp_path,
        conn_id,
        master,
        deploy_mode,
        spark_conf={"spark.hadoop.fs.s3a.secret.key": "s3-s3cret", "spark.sql.shuffle.partitions": "4"},
    )
    # the captured hook does not run the driver, so no result comes back: the batch fails as it would
    with pytest.raises(BatchJobError, match="left no result"):
        engine.run(spec)
    (seen,) = _Captured.seen
    return seen


def _key_in(seen: dict, key: str) -> str:
    return handoff.unseal(seen["spec"]["kafka"], key)["sasl.password"]


@pytest.mark.parametrize(
    "master", ["yarn", "k8s://https://api.example:6443", "spark://127.0.0.1:7077", "local[2]"]
)
def test_client_mode_hands_the_key_over_in_spark_submits_environment_only(monkeypatch, tmp_path, master):
    seen = _submit(monkeypatch, tmp_path, "spark_client", master, "client")
    key = seen["env"][handoff.SPEC_KEY_ENV]
    assert _key_in(seen, key) == PASSWORD  # the driver, which runs inside spark-submit, can unseal
    line = " ".join(seen["cmd"])
    assert key not in line and handoff.SPEC_KEY_ENV not in line, seen["masked"]
    assert PASSWORD not in line and "s3-s3cret" not in line
    assert "appMasterEnv" not in line and "driverEnv" not in line
    assert key not in seen["properties"]
    assert "s3-s3cret" in seen["properties"]  # secret Spark settings: the private file, as before


def test_yarn_cluster_mode_hands_the_key_over_in_the_private_properties_file(monkeypatch, tmp_path):
    seen = _submit(monkeypatch, tmp_path, "spark_yarn_cluster", "yarn", "cluster")
    line = " ".join(seen["cmd"])
    assert handoff.SPEC_KEY_ENV not in line and "appMasterEnv" not in line, seen["masked"]
    assert handoff.SPEC_KEY_ENV not in seen["env"]
    entry = f"spark.yarn.appMasterEnv.{handoff.SPEC_KEY_ENV}="
    (prop,) = [ln for ln in seen["properties"].splitlines() if ln.startswith(entry)]
    key = prop[len(entry) :].replace("\\=", "=")
    assert key not in line
    assert _key_in(seen, key) == PASSWORD
    # Spark's default redaction pattern hides the setting in its UI and event log
    assert "secret" in handoff.SPEC_KEY_ENV.lower()


def test_kubernetes_cluster_mode_is_refused_before_anything_is_written(monkeypatch, tmp_path):
    engine, spec = _engine_and_spec(
        monkeypatch, tmp_path, "spark_k8s_cluster", "k8s://https://api:6443", "cluster"
    )
    with pytest.raises(BatchJobError, match=r"(?s)Kubernetes.*pod.*deploy-mode to client.*connect engine"):
        engine.run(spec)
    assert _Captured.seen == [] and not (tmp_path / "sink").exists()


def test_a_properties_file_keeps_the_clusters_spark_defaults(monkeypatch, tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "# a cluster's defaults\n"
        "spark.yarn.queue   etl\n"
        "spark.eventLog.enabled=true\n"
        "! another comment\n"
        "spark.master: yarn\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert spark_defaults() == {
        "spark.yarn.queue": "etl",
        "spark.eventLog.enabled": "true",
        "spark.master": "yarn",
    }
    seen = _submit(monkeypatch, tmp_path, "spark_defaults_kept", "yarn", "client")
    assert "spark.yarn.queue=etl" in seen["properties"].splitlines()
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "nowhere"))
    assert spark_defaults() == {}


def test_credentials_whose_names_spark_does_not_redact_stay_off_the_command_line(monkeypatch, tmp_path):
    """Issue 39, item 11: a setting is secret unless it is known to hold none — an S3 encryption key, a
    GCS service account's private key, an Azure SAS token, a catalog's JDBC URL go to the private
    properties file, and the application's redaction pattern names each of them."""
    hidden = {
        "spark.hadoop.fs.s3a.encryption.key": "sse-k3y-value",
        "spark.hadoop.fs.gs.auth.service.account.private.key": "gs-pr1vate-key",
        "spark.hadoop.fs.azure.sas.box.acct.blob.core.windows.net": "sv=2024&sig=s4s",
        "spark.sql.catalog.lake.uri": "jdbc:postgresql://u:jdbc-pw@h/db",
    }
    engine, spec = _engine_and_spec(
        monkeypatch,
        tmp_path,
        "spark_local",
        "local[2]",
        "client",
        spark_conf={**hidden, "spark.sql.shuffle.partitions": "4"},
    )
    with pytest.raises(BatchJobError, match="left no result"):
        engine.run(spec)
    (seen,) = _Captured.seen
    line = " ".join(seen["cmd"])
    (regex,) = [a.split("=", 1)[1] for a in seen["cmd"] if a.startswith("spark.redaction.regex=")]
    rest = line.replace(regex, "")  # the names are in the redaction pattern only
    for key, value in hidden.items():
        name = key.removeprefix("spark.hadoop.")  # Spark shows a Hadoop setting under its Hadoop name too
        assert value not in line and name not in rest, key
        assert f"{key}=" in seen["properties"]
        assert f"\\Q{name}\\E" in regex
    assert "spark.sql.shuffle.partitions=4" in line  # known safe: on the command line as before
