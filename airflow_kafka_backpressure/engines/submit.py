"""The submit engine: one Spark application per batch, through the Spark provider's SparkSubmitHook.

Every attempt gets a hand-off directory under the sink (:mod:`airflow_kafka_backpressure.batch.handoff`):
the worker writes the spec there (Kafka properties sealed, the key in the driver's environment, see
below), the driver takes it, runs :func:`~airflow_kafka_backpressure.spark.job.run_batch` and leaves its metrics
or its error there. Client and cluster deploy mode (YARN, Kubernetes) take the same path, so every
test of this engine exercises what cluster mode needs. The worker removes the directory and its
local scratch directory when the job ends.

Every Spark setting of the pipeline not known to hold no secret (:mod:`.secret_settings`) is passed
in a private ``--properties-file``, never as ``--conf`` on the command line, and the application's
``spark.redaction.regex`` names it, so Spark's UI and event log hide its value.

The spec's key never goes on a command line (:func:`key_route`). The provider's hook turns its
``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` for YARN and
Kubernetes masters (client mode included), where ``ps``, the task log and the Spark UI show them, so
the engine never uses ``env_vars``:

* client mode, any master: the driver runs inside spark-submit, which gets the key in its process
  environment (``Popen(env=...)`` through ``hook.submit``);
* cluster mode on YARN: the driver is the application master; the key goes in the private properties
  file as ``spark.yarn.appMasterEnv.KBP_SPEC_SECRET``, a name Spark's redaction pattern hides in its UI
  and event log;
* cluster mode on Kubernetes: refused. Spark would write the key into the driver pod's spec
  (``spark.kubernetes.driverEnv``), readable by whoever can read pods; use client mode or the connect
  engine.

Stopping (timeout, ``on_kill``, the task's supervisor gone): the spark-submit process this attempt
started and everything under it get SIGTERM (the JVM's shutdown hooks clean its temporary
directories), then SIGKILL; the provider hook's ``on_kill`` kills a cluster-mode application on
YARN or Kubernetes. When the task process dies without stopping anything (SIGKILL), a client-mode
driver notices, ends its application and removes the attempt's hand-off and scratch directories
(:mod:`airflow_kafka_backpressure.spark.launcher_watch`; the PID and the scratch directory travel in
the driver's environment). ``spark-submit`` is started without ``preexec_fn``:
that would fork the whole multi-threaded task process and run Python before exec, which can hang.

No Airflow imports: the caller passes a factory for the provider's hook.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import airflow_kafka_backpressure as pkg
from airflow_kafka_backpressure.batch import handoff
from airflow_kafka_backpressure.batch.models import BatchMetrics, JobSpec

from . import BatchJobError, Engine
from .environment import spark_conf_defaults, spark_defaults, spark_submit_env, work_root
from .process import child_ids, new_children, stop_processes, with_descendants
from .secret_settings import REDACTION_KEY, redaction_regex, split_secret_settings

log = logging.getLogger(__name__)

_SPARK_SUBMIT_MARKERS = ("org.apache.spark.deploy.SparkSubmit", "spark-submit")
_EXIT_CODE = re.compile(r"Error code is: (-?\d+)")


def executor_conf(master: str, executors: int, executor_cores: int) -> dict[str, str]:
    """Spark settings that give the job ``executors`` executors on ``master``.

    Standalone: ``spark.cores.max / spark.executor.cores`` executors (``spark.executor.instances``
    is ignored there), and the job starts once all of them registered. YARN and Kubernetes:
    ``spark.executor.instances``. Local: one JVM, nothing to set.
    """
    if master.startswith("spark://"):
        return {
            "spark.executor.cores": str(executor_cores),
            "spark.cores.max": str(executors * executor_cores),
            # start once every executor asked for has registered (Spark waits at most
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


def job_script_path() -> str:
    """The application to pass to ``spark-submit``: the batch job's module file (located, not
    imported: the driver program runs in Spark, not in the Airflow worker)."""
    import importlib.util

    spec = importlib.util.find_spec("airflow_kafka_backpressure.spark.job")
    if spec is None or not spec.origin:  # pragma: no cover - the package is always installed with it
        raise RuntimeError("airflow_kafka_backpressure.spark.job is missing from the installed package")
    return str(Path(spec.origin).resolve())


def package_zip(dest_dir: str | os.PathLike[str]) -> str:
    """Zip the ``airflow_kafka_backpressure`` package (for ``--py-files`` and Connect artifacts).

    Byte-identical for identical sources (fixed timestamps, sorted entries), so it can be cached.
    """

    root = Path(pkg.__file__).resolve().parent
    return zip_tree(
        root,
        "airflow_kafka_backpressure",
        Path(dest_dir),
        f"airflow_kafka_backpressure-{pkg.__version__}.zip",
    )


def zip_tree(root: Path, arc_root: str, dest: Path, name: str) -> str:
    """Zip the ``.py`` (and ``py.typed``) files under ``root`` as ``arc_root/...`` into ``dest/name``."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / name
    tmp = dest / f".{name}.{uuid.uuid4().hex}.tmp"  # concurrent builders each rename a whole file
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    )
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for p in files:
            info = zipfile.ZipInfo(f"{arc_root}/{p.relative_to(root).as_posix()}", (1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, p.read_bytes())
    os.replace(tmp, target)
    return str(target)


def split_secret_conf(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(plain, secret)`` Spark settings (:func:`.secret_settings.split_secret_settings`); the plain
    ones get ``spark.redaction.regex`` extended with the secret ones' names."""
    plain, secret = split_secret_settings(conf)
    if secret:
        current = (
            secret.pop(REDACTION_KEY, None) or plain.get(REDACTION_KEY) or spark_defaults().get(REDACTION_KEY)
        )
        plain[REDACTION_KEY] = redaction_regex(secret, current)
    return plain, secret


def write_properties_file(path: Path, conf: Mapping[str, str]) -> str:
    """A private Java properties file for ``spark-submit --properties-file``."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for k, v in sorted(conf.items()):
            f.write(f"{esc(k)}={esc(str(v))}\n")
    return str(path)


def key_route(master: str, deploy_mode: str) -> str:
    """How the spec's key reaches the driver: ``"process-env"`` (client mode: spark-submit's own
    environment) or ``"yarn-properties-file"`` (YARN cluster mode). Raises ``ValueError`` with the fix
    where no route keeps it off a command line and out of a pod spec."""
    if (deploy_mode or "client") != "cluster":
        return "process-env"
    if master.startswith("yarn"):
        return "yarn-properties-file"
    if master.startswith("k8s://"):
        raise ValueError(
            f"the submit engine does not run in cluster deploy mode on Kubernetes ({master}): the key of the "
            "job spec's sealed Kafka properties would be written into the driver pod's spec "
            "(spark.kubernetes.driverEnv), readable by anyone who can read pods. Set the Spark connection's "
            "deploy-mode to client (the driver runs in the Airflow worker), or use the connect engine"
        )
    raise ValueError(
        f"cluster deploy mode is supported on YARN only (master {master}); set the Spark connection's "
        "deploy-mode to client, or use the connect engine"
    )


def exit_description(error: BaseException | None) -> str:
    """What a failed spark-submit call says about the process's end (never its command line)."""
    if error is None:
        return "spark-submit exited normally"
    m = _EXIT_CODE.search(str(error))
    if not m:
        return f"spark-submit failed: {type(error).__name__}"
    code = int(m.group(1))
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"spark-submit was killed by {name}"
    return f"spark-submit exited with code {code}"


class SubmitEngine(Engine):
    """One batch through ``spark-submit``.

    :param make_hook: builds the provider's ``SparkSubmitHook`` from keyword arguments
        (``conf``, ``properties_file``, ``py_files``, ``name``, ``application_args``, ``env_vars``,
        ``executor_memory``, ``driver_memory``); the connection id is the caller's business.
    :param master: / :param deploy_mode: of the Spark connection (for executor settings and checks).
    :param work_root: local directory for the package zip and per-attempt scratch directories.
    """

    name = "submit"

    def __init__(
        self,
        make_hook: Callable[..., Any],
        *,
        master: str,
        deploy_mode: str,
        work_root: Path,
        executors: int,
        executor_cores: int = 1,
        executor_memory: str | None = None,
        driver_memory: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.make_hook = make_hook
        self.master = master
        self.deploy_mode = deploy_mode or "client"
        self.work_root = Path(work_root)
        self.executors = executors
        self.executor_cores = executor_cores
        self.executor_memory = executor_memory
        self.driver_memory = driver_memory
        self.spark_conf = dict(spark_conf or {})
        self._hook: Any = None
        self._children_before: frozenset[tuple[int, float]] | None = None  # set when spark-submit starts

    @property
    def cluster_mode(self) -> bool:
        return self.deploy_mode == "cluster"

    def run(self, spec: JobSpec) -> BatchMetrics:
        plan = spec.plan
        if self.cluster_mode and self.master.startswith("spark://"):
            raise BatchJobError(
                plan.batch_id,
                f"Spark refuses Python applications in cluster deploy mode on a standalone master ({self.master}); "
                "set the Spark connection's deploy-mode to client, or use the connect engine",
            )
        try:
            route = key_route(self.master, self.deploy_mode)
        except ValueError as e:
            raise BatchJobError(plan.batch_id, str(e)) from None
        attempt = f"{plan.pipeline}-batch-{plan.batch_id}-{spec.token}"
        work = self.work_root / "work" / attempt
        job = handoff.job_dir(plan.sink, attempt)
        failure: BaseException | None = None
        result: BatchMetrics | str | None = None
        try:
            work.mkdir(parents=True, exist_ok=True)
            spec_uri, key = handoff.write_spec(job, spec)
            local_only = is_loopback_master(self.master)
            plain, secret = split_secret_conf(self.spark_conf)
            conf = spark_conf_defaults(work, plain, local_only=local_only)
            for k, v in executor_conf(self.master, self.executors, self.executor_cores).items():
                if k == "spark.scheduler.minRegisteredResourcesRatio":
                    conf.setdefault(k, v)  # a user's own setting wins
                else:
                    conf[k] = v
            popen_env: dict[str, str] | None = None
            if route == "process-env":
                # the driver runs under this process: it ends the application if this process dies
                # (and removes this attempt's hand-off and scratch directories, which this process no longer can)
                env = {
                    handoff.SPEC_KEY_ENV: key,
                    handoff.LAUNCHER_PID_ENV: str(os.getpid()),
                    handoff.SCRATCH_DIR_ENV: str(work),
                }
                popen_env = {**os.environ, **spark_submit_env(work, env, local_only=local_only)}
            else:
                secret = {**secret, f"spark.yarn.appMasterEnv.{handoff.SPEC_KEY_ENV}": key}
            hook = self.make_hook(
                conf=conf,
                # spark-submit reads a properties file instead of spark-defaults.conf: the defaults go first
                properties_file=(
                    write_properties_file(work / "secret.properties", {**spark_defaults(), **secret})
                    if secret
                    else None
                ),
                py_files=package_zip(self.work_root / "dist"),
                executor_memory=self.executor_memory,
                driver_memory=self.driver_memory,
                name=f"kbp-{plan.pipeline}-batch-{plan.batch_id}",
                application_args=["--spec", spec_uri],
            )
            if self.stop_reason is None:
                self._hook = hook
                self._children_before = child_ids()
                log.info(
                    "Submitting batch %s to %s (%s mode) with %s executor(s)",
                    plan.batch_id,
                    self.master,
                    self.deploy_mode,
                    self.executors,
                )
                try:
                    if popen_env is None:
                        hook.submit(application=job_script_path())
                    else:  # Popen's environment: never the hook's env_vars (see the module's doc)
                        hook.submit(application=job_script_path(), env=popen_env)
                except Exception as e:  # noqa: BLE001 - described below, never with its command line
                    failure = e
                result = handoff.read_result(job)
        finally:
            for cleanup in (job.delete, lambda: shutil.rmtree(work, ignore_errors=True)):
                try:
                    cleanup()
                except Exception as e:  # noqa: BLE001 - a leftover, not a failed batch
                    log.warning("could not clean up after batch %s: %s", plan.batch_id, e)
        stopped = self.stopped_error(spec)
        if stopped is not None:
            raise stopped
        if isinstance(result, BatchMetrics):
            if result.batch_id != plan.batch_id:
                raise BatchJobError(plan.batch_id, f"the driver reported metrics of batch {result.batch_id}")
            return result
        if isinstance(result, str):
            raise BatchJobError(plan.batch_id, result)
        raise BatchJobError(
            plan.batch_id,
            f"{exit_description(failure)} and the driver left no result in {job.uri}: it was killed, ran out "
            "of memory, or could not start (see spark-submit's output in the task log)",
        )

    def _stop(self) -> None:
        before = self._children_before
        procs = with_descendants(new_children(before, _SPARK_SUBMIT_MARKERS)) if before is not None else []
        if self.cluster_mode and self._hook is not None:
            self._hook.on_kill()  # the application runs elsewhere: the provider knows how to kill it
        stop_processes(procs)


def spark_master(hook: Any) -> str:
    """The master of the hook's ``spark`` connection, where every batch's application runs."""
    return str(hook.submit_connection()[0])


def from_hook(hook: Any, executors: int) -> SubmitEngine:
    """The engine of an attempt for :class:`~airflow_kafka_backpressure.hooks.spark_batch.SparkBatchHook`:
    its ``spark`` connection through the Spark provider's ``SparkSubmitHook`` (imported here, when a
    batch launches), ``executors`` executors."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    master, deploy_mode = hook.submit_connection()
    conn_id = hook.spark_conn_id
    return SubmitEngine(
        lambda **kw: SparkSubmitHook(conn_id=conn_id, **kw),
        master=master,
        deploy_mode=deploy_mode,
        work_root=work_root(),
        executors=executors,
        executor_cores=hook.pipeline.executor_cores,
        executor_memory=hook.pipeline.executor_memory,
        driver_memory=hook.pipeline.driver_memory,
        spark_conf=hook.spark_conf,
    )
