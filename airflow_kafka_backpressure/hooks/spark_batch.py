"""SparkBatchHook: run one planned batch on Spark and return its metrics.

The one place the Airflow worker launches Spark work. It owns the Spark connection of the chosen
engine and everything around a run:

* ``engine="submit"`` — the Spark provider's ``spark`` connection (``spark_default``) and its
  ``SparkSubmitHook``: a new application per batch, client or cluster deploy mode
  (:mod:`airflow_kafka_backpressure.engines.submit`);
* ``engine="connect"`` — the provider's ``spark_connect`` connection (``spark_connect_default``): a
  client session to a long-lived Spark Connect server (:mod:`airflow_kafka_backpressure.engines.connect`);
* a per-batch timeout, and stopping the batch's Spark work when the task is killed (:meth:`on_kill`)
  or its supervisor dies (:func:`airflow_kafka_backpressure.engines.supervise`).

Read parallelism: the batch asks for ``executors × executor_cores`` input partitions at least
(large offset ranges are split), on both engines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk import BaseHook

from airflow_kafka_backpressure.batch.models import Adoption, BatchMetrics, BatchPlan, JobSpec, new_token
from airflow_kafka_backpressure.config.pipeline import PipelineConfig

from ..decoders import DecoderError, SchemaSource
from ..decoders.decoding import Decoding, prepare_decoding
from ..engines import ENGINES, BatchJobError, Engine, engine_for, supervise
from ..engines import spark_master as engines_spark_master
from ..engines.environment import work_root  # noqa: F401 - where the tests and users find it
from .schema_registry import SchemaRegistryError, SchemaRegistryHook


class SparkBatchHook(BaseHook):
    """Runs a pipeline's batches on Spark with its engine (see the module doc).

    :param pipeline: what the batches are (engine and its connection, batch timeout, executor sizing,
        Spark settings, reader, transform, stall timeout, reader and sink options, sink format): every
        field is read from the pipeline, where each is declared once with its default.
    """

    hook_name = "Kafka backpressure Spark batch"

    def __init__(self, pipeline: PipelineConfig) -> None:
        super().__init__()
        if pipeline.engine not in ENGINES:
            raise ValueError(f"engine = {pipeline.engine!r} is invalid: use one of {', '.join(ENGINES)}")
        self.pipeline = pipeline
        self._running: Engine | None = None

    @classmethod
    def for_pipeline(cls, p: PipelineConfig) -> SparkBatchHook:
        return cls(p)

    @property
    def spark_conn_id(self) -> str:
        return self.pipeline.spark_conn_id

    @property
    def spark_connect_conn_id(self) -> str:
        return self.pipeline.spark_connect_conn_id

    @property
    def spark_conf(self) -> dict[str, str]:
        return dict(self.pipeline.spark_conf)

    # ----- connections ------------------------------------------------------------------------
    def submit_connection(self) -> tuple[str, str]:
        """``(master, deploy mode)`` of the ``spark`` connection, by the Spark provider's rules."""
        conn = self.get_connection(self.spark_conn_id)
        if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
            master = conn.host
        else:
            master = f"{conn.conn_type}://{conn.host or ''}"
        if conn.port:
            master = f"{master}:{conn.port}"
        return master, str((conn.extra_dejson or {}).get("deploy-mode") or "client")

    def spark_master(self) -> str | None:
        """The Spark master the pipeline's batches run on, where the engine can tell (see
        :func:`~airflow_kafka_backpressure.engines.spark_master`)."""
        return engines_spark_master(self.pipeline.engine, self)

    def connect_url(self) -> str:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return SparkConnectHook(conn_id=self.spark_connect_conn_id).get_connection_url()

    def _engine(self, executors: int) -> Engine:
        return engine_for(self.pipeline.engine, self, executors)

    # ----- running ----------------------------------------------------------------------------
    def run(
        self,
        plan: BatchPlan,
        executors: int,
        kafka_properties: Mapping[str, Any],
        *,
        token: str | None = None,
        attempt: int | None = None,
        adopt: Adoption | None = None,
        heartbeat: Callable[[], Any] | None = None,
        heartbeat_s: float = 30.0,
    ) -> BatchMetrics:
        """Run ``plan`` with ``executors`` executors and return its metrics once its output is
        committed to the sink. Raises :class:`~airflow_kafka_backpressure.engines.BatchJobError`
        (``BatchStopped`` for a timeout or a kill) with a message saying what happened.

        ``token`` names the attempt (its staging directory in the sink; the ledger's lease token);
        ``attempt`` is the ledger's attempt number (the sink refuses to let an older attempt commit
        over a newer one); ``adopt`` lets the job take over an earlier attempt's committed output;
        ``heartbeat`` is called every ``heartbeat_s`` while the batch runs (the lease renewal); if it
        raises, the batch is stopped."""
        import time

        p = self.pipeline
        decoding = self.decoding(plan)
        engine = self._engine(executors)
        spec = JobSpec(
            plan=plan,
            kafka=dict(kafka_properties),
            launched_at_ms=int(time.time() * 1000),
            token=token or new_token(),
            reader=p.reader,
            transform=p.transform,
            stall_timeout_s=p.stall_timeout_s,
            min_partitions=executors * p.executor_cores,
            options={**p.reader_options.job_options(), **p.sink_options.job_options()},
            attempt=attempt,
            adopt=adopt,
            sink_format=p.sink_format,
            decoding=None if decoding is None else decoding.to_dict(),
        )
        self._running = engine
        try:
            return supervise(
                engine, spec, timeout_s=p.batch_timeout, heartbeat=heartbeat, heartbeat_s=heartbeat_s
            )
        finally:
            self._running = None

    def decoding(self, plan: BatchPlan) -> Decoding | None:
        """How ``plan``'s records are decoded (None: Kafka's raw columns): each decoder prepared
        here, on the worker, with the pipeline's ``schema_registry`` connection, after the plan
        chose its offsets (so every schema of a record in its ranges is registered by now). The
        job gets schema text only. Raises :class:`~..engines.BatchJobError` naming the decoder,
        the subject or the connection."""
        decoders = self.pipeline.decoders()
        if not decoders:
            return None
        conn_id = self.pipeline.schema_registry_conn_id

        def registry() -> SchemaSource:
            return SchemaRegistryHook(conn_id or SchemaRegistryHook.default_conn_name).schemas()

        try:
            return prepare_decoding(
                decoders,
                self.pipeline.topics,
                registry if conn_id else None,
                max_bad_records=self.pipeline.max_bad_records,
                keep_raw_value=self.pipeline.keep_raw_value,
            )
        except (DecoderError, SchemaRegistryError) as e:
            raise BatchJobError(
                plan.batch_id, f"the batch's record formats could not be prepared: {e}"
            ) from e

    def on_kill(self, reason: str = "the Airflow task was killed") -> None:
        """Stop the running batch's Spark work (from a signal handler or another thread)."""
        engine = self._running
        if engine is not None:
            engine.stop(reason)
