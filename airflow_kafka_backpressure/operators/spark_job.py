"""Submit one batch's bounded Spark job through the Spark provider's SparkSubmitHook.

Shared by the ingest and replay operators: the same plan always runs the same way and writes the
same sink path, so a retry, a rerun or a replay can only replace a batch, never duplicate it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from ..models import BatchMetrics, BatchPlan, JobSpec
from ..pipeline import PipelineConfig

log = logging.getLogger(__name__)

ERROR_LINE = re.compile(r"KBP_ERROR (.+)")


def executor_conf(master: str, executors: int, executor_cores: int) -> dict[str, str]:
    """Spark settings that give the job ``executors`` executors on ``master``.

    Standalone: ``spark.cores.max / spark.executor.cores`` executors (``spark.executor.instances``
    is ignored there). YARN and Kubernetes: ``spark.executor.instances``. Local: one JVM, nothing
    to set.
    """
    if master.startswith("spark://"):
        return {
            "spark.executor.cores": str(executor_cores),
            "spark.cores.max": str(executors * executor_cores),
            # start the job once every executor asked for has registered (Spark waits at most
            # spark.scheduler.maxRegisteredResourcesWaitingTime, 30 s by default), so the batch
            # really runs with the target it was given
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        }
    if master.startswith("yarn") or master.startswith("k8s://"):
        return {"spark.executor.instances": str(executors), "spark.executor.cores": str(executor_cores)}
    return {}


def is_loopback_master(master: str) -> bool:
    """True for ``local[...]`` and masters on this machine: Spark then binds to 127.0.0.1 only."""
    if master.startswith("local"):
        return True
    hosts = master.split("://", 1)[-1].split(",")
    return all(h.rsplit(":", 1)[0].strip("[]") in ("127.0.0.1", "localhost", "::1") for h in hosts)


def work_root() -> Path:
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return Path(home) / "kafka_backpressure"


def _job_error(e: Exception) -> str:
    """The job's own error line when spark-submit printed one, else the exception's text."""
    text = str(e)
    found = ERROR_LINE.findall(text)
    return found[-1].strip() if found else text[-4000:]


def submit_batch(
    pipeline: PipelineConfig,
    plan: BatchPlan,
    executors: int,
    kafka_properties: dict[str, Any],
    *,
    attempt: str,
    task_log: logging.Logger | None = None,
) -> BatchMetrics:
    """Run the bounded job for ``plan`` with ``executors`` executors; return its metrics.

    Raises ``BatchJobError`` with the job's error message when spark-submit fails.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from ..spark.environment import spark_conf_defaults, spark_submit_env
    from ..spark.job import job_script_path, package_zip

    lg = task_log or log
    root = work_root()
    work = root / "work" / pipeline.name / f"batch-{plan.batch_id}-{attempt}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    spec_path = work / "spec.json"
    metrics_path = work / "metrics.json"

    launched_at_ms = int(time.time() * 1000)
    spec = JobSpec(
        plan=plan,
        kafka=kafka_properties,
        metrics_path=str(metrics_path),
        launched_at_ms=launched_at_ms,
        reader=pipeline.reader,
        transform=pipeline.transform,
        stall_timeout_s=pipeline.stall_timeout_s,
    )
    # the spec may hold Kafka credentials: owner-only, and removed after the run
    fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(spec.to_dict(), f)

    probe = SparkSubmitHook(conn_id=pipeline.spark_conn_id)
    master = probe._connection["master"]
    deploy_mode = probe._connection.get("deploy_mode") or "client"
    local_only = is_loopback_master(master)
    conf = spark_conf_defaults(work, pipeline.spark_conf, local_only=local_only)
    for key, value in executor_conf(master, executors, pipeline.executor_cores).items():
        if key == "spark.scheduler.minRegisteredResourcesRatio":
            conf.setdefault(key, value)  # a user's own setting wins
        else:
            conf[key] = value
    env = None if deploy_mode == "cluster" else spark_submit_env(work, local_only=local_only)
    lg.info("Submitting batch %s to %s with %s executor(s)", plan.batch_id, master, executors)
    hook = SparkSubmitHook(
        conf=conf,
        conn_id=pipeline.spark_conn_id,
        py_files=package_zip(root / "dist"),
        executor_memory=pipeline.executor_memory,
        driver_memory=pipeline.driver_memory,
        name=f"kbp-{pipeline.name}-batch-{plan.batch_id}",
        application_args=["--spec", str(spec_path)],
        env_vars=env,
    )
    try:
        hook.submit(application=job_script_path())
    except Exception as e:
        raise BatchJobError(plan.batch_id, _job_error(e)) from e
    finally:
        spec_path.unlink(missing_ok=True)
    try:
        metrics = BatchMetrics.from_dict(json.loads(metrics_path.read_text()))
    except (OSError, ValueError, KeyError) as e:
        raise BatchJobError(
            plan.batch_id,
            f"spark-submit finished but left no readable metrics at {metrics_path} ({e}); "
            "only client deploy mode is supported",
        ) from e
    shutil.rmtree(work, ignore_errors=True)
    if metrics.batch_id != plan.batch_id:
        raise BatchJobError(plan.batch_id, f"metrics belong to batch {metrics.batch_id}")
    return metrics


class BatchJobError(RuntimeError):
    def __init__(self, batch_id: int, message: str):
        self.batch_id = batch_id
        self.job_message = message
        super().__init__(f"Batch {batch_id} failed: {message}")
