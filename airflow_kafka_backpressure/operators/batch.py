"""What the ingest and replay operators share: run a planned batch on Spark and record the outcome.

The batch is run through :class:`~airflow_kafka_backpressure.hooks.spark_batch.SparkBatchHook`
(the pipeline's engine) under a ledger **lease**: the attempt's token is taken when the batch is
marked running (replaying), renewed while the Spark work runs, and checked when the batch is
finished, so an attempt that lost the batch to a newer one can neither finish it nor go on running.
A batch whose worker died is replayable once its lease has expired — minutes, not a day.

Where the sink format's commits into the table are not safe among Spark drivers (Delta on S3), the
batch's job runs under the ledger's lock of the table (:func:`~.common.sink_commit_lock`): one job
at a time writes it, the others wait (renewing their leases) for up to a batch's task timeout.

The batch is marked succeeded (replayed) only after its output is committed to the sink, and failed
— replayable — with a message saying what happened otherwise: the job's own error, a timeout, a kill.
A kill marks the batch failed at once (Airflow sends SIGKILL a few seconds after the SIGTERM that
runs ``on_kill``) and then stops the batch's Spark work.

Each committed batch becomes an event of the pipeline's sink Asset (one per batch, replays
included), and the task's OpenLineage facets describe the batches it committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from airflow_kafka_backpressure.batch.fault_points import after_commit
from airflow_kafka_backpressure.batch.models import Adoption, BatchMetrics, BatchPlan, OffsetRange
from airflow_kafka_backpressure.config.pipeline import DEFAULT_LEASE_S as LEASE_S
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.operators.assets import batch_event_extra, emit_batch_events, sink_asset
from airflow_kafka_backpressure.operators.lineage import batch_lineage

from ..hooks.spark_batch import SparkBatchHook
from ..ledger import LeaseLost, Ledger, new_attempt_token
from ..sinks import sink_format_for
from .base import PipelineOperator
from .common import last_maintenance, sink_commit_lock

#: How often a running attempt renews its lease (at most a quarter of the lease).
LEASE_RENEW_S = 30.0


class BatchRunningOperator(PipelineOperator):
    """Base of the operators that run batches: the Spark hook, the run-and-mark step, ``on_kill``,
    the sink Asset as outlet, lineage. The Spark connection ids are template fields too."""

    template_fields: Sequence[str] = (
        *PipelineOperator.template_fields,
        "spark_conn_id",
        "spark_connect_conn_id",
    )

    def __init__(
        self,
        *,
        pipeline: PipelineConfig | dict[str, Any],
        spark_conn_id: str | None = None,
        spark_connect_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        p = pipeline if isinstance(pipeline, PipelineConfig) else PipelineConfig.from_dict(dict(pipeline))
        kwargs.setdefault("outlets", [sink_asset(p)])
        super().__init__(pipeline=p, **kwargs)
        self.spark_conn_id = spark_conn_id or self._pipeline.spark_conn_id
        self.spark_connect_conn_id = spark_connect_conn_id or self._pipeline.spark_connect_conn_id
        self._current: tuple[Ledger, int, str] | None = None
        self._committed: list[dict[str, Any]] = []
        self._attempts: dict[str, int] = {}

    def _overrides(self) -> dict[str, Any]:
        return {
            **super()._overrides(),
            "spark_conn_id": self.spark_conn_id,
            "spark_connect_conn_id": self.spark_connect_conn_id,
        }

    @cached_property
    def batch_hook(self) -> SparkBatchHook:
        return SparkBatchHook.for_pipeline(self.pipeline)

    @property
    def _lease_s(self) -> float:
        return self.pipeline.lease_s or LEASE_S

    # ----- one batch ----------------------------------------------------------------------------
    def claim(
        self, ledger: Ledger, batch_id: int, *, replay: bool, executors: int | None = None, **kw: Any
    ) -> str:
        """Mark the batch running (``replay``: replaying) under a new lease; returns its token."""
        token = new_attempt_token()
        lease_ms = int(self._lease_s * 1000)
        if replay:
            record = ledger.mark_replaying(batch_id, token=token, lease_ms=lease_ms, **kw)
        else:
            record = ledger.mark_running(batch_id, executors=executors, token=token, lease_ms=lease_ms)
        # the ledger's attempt number fences the sink: an older attempt cannot commit over this one
        self._attempts[token] = record.attempts
        return token

    def run_and_mark(
        self,
        ledger: Ledger,
        plan: BatchPlan,
        executors: int,
        kafka_properties: dict[str, Any],
        *,
        token: str,
        replay: bool,
        adopt: Adoption | None = None,
        before_finish: Callable[[BatchMetrics], None] | None = None,
    ) -> BatchMetrics:
        """Run ``plan`` (claimed with ``token``); mark it succeeded (``replay``: replayed) once
        committed, or failed.

        ``adopt``: a committed sink version written by that earlier attempt for those ranges is taken
        as the batch's output without reading Kafka again (see :class:`~..models.Adoption`).
        ``before_finish`` runs after the job, before the batch is marked (e.g. recording losses)."""
        self._current = (ledger, plan.batch_id, token)

        def renew() -> int:
            return ledger.renew_lease(plan.batch_id, token, int(self._lease_s * 1000))

        renew_s = min(LEASE_RENEW_S, self._lease_s / 4)
        try:
            # a table whose commits are not safe among drivers (Delta on S3): one batch's job at a time
            with sink_commit_lock(self.pipeline, ledger, plan.batch_id, while_waiting=renew, every_s=renew_s):
                metrics = self.batch_hook.run(
                    plan,
                    executors,
                    kafka_properties,
                    token=token,
                    attempt=self._attempts.get(token),
                    adopt=adopt,
                    heartbeat=renew,
                    heartbeat_s=renew_s,
                )
            if before_finish is not None:
                before_finish(metrics)
        except BaseException as e:
            self._mark_failed(
                ledger, plan.batch_id, token, getattr(e, "job_message", None) or f"{type(e).__name__}: {e}"
            )
            raise
        finally:
            self._current = None
        after_commit(self.pipeline.name, plan.batch_id)  # a no-op outside the fault tests
        self.finish(ledger, plan, metrics, token=token, replay=replay)
        return metrics

    def finish(
        self, ledger: Ledger, plan: BatchPlan, metrics: BatchMetrics, *, token: str, replay: bool
    ) -> None:
        """Record a committed batch: ledger status and measured executors, and its Asset event."""
        finish = ledger.mark_replayed if replay else ledger.mark_succeeded
        finish(
            plan.batch_id, metrics.records, metrics.processing_ms, at_ms=metrics.committed_at_ms, token=token
        )
        # measured, not just the target; bad records only where the batch was decoded
        decoded = self.pipeline.decoders()
        ledger.record_metrics(
            plan.batch_id, executors=metrics.executors, bad_records=metrics.bad_records if decoded else None
        )
        if plan.records:  # an empty batch writes nothing to the sink: no event
            self._committed.append(
                batch_event_extra(
                    plan.batch_id,
                    plan.ranges,
                    metrics.records,
                    replay=replay,
                    # where the format puts the batch: its directory, or the table holding every batch
                    output_path=sink_format_for(
                        self.pipeline.sink_format, self.pipeline.sink_options.job_options()
                    ).event_path(plan.sink, plan.batch_id),
                    run_id=plan.run_id,
                    sink_format=self.pipeline.sink_format,
                    read_at=metrics.read_at,
                    last_maintenance=last_maintenance(self.pipeline),
                )
            )
        self.log.info(
            "Batch %s: %s records in %s ms with %s executor(s)",
            plan.batch_id,
            metrics.records,
            metrics.processing_ms,
            metrics.executors,
        )

    def emit_events(self, context: Any) -> None:
        """One sink-Asset event per batch this task committed (sent when the task succeeds)."""
        emit_batch_events(context, self.pipeline, self._committed)

    def _mark_failed(self, ledger: Ledger, batch_id: int, token: str, message: str) -> None:
        try:
            ledger.mark_failed(batch_id, message, token=token)
        except LeaseLost:
            self.log.warning("Batch %s belongs to another attempt now; leaving its status to it", batch_id)

    def on_kill(self) -> None:
        current = self._current
        if current is not None:
            ledger, batch_id, token = current
            try:
                self._mark_failed(
                    ledger,
                    batch_id,
                    token,
                    "the Airflow task was killed while the batch ran (on_kill); the batch is replayable",
                )
            except Exception as e:  # noqa: BLE001 - stopping Spark matters more
                self.log.warning("could not mark batch %s failed: %s", batch_id, e)
        self.batch_hook.on_kill()

    # ----- lineage ------------------------------------------------------------------------------
    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage facets of the batches this task committed (None without the provider)."""

        p = self.pipeline
        bootstrap = str(self.kafka_hook.client_properties().get("bootstrap.servers", ""))
        lineage = None
        for b in self._committed:
            one = batch_lineage(
                pipeline=p.name,
                bootstrap_servers=bootstrap,
                sink=p.sink,
                batch_id=b["batch_id"],
                ranges=[OffsetRange.from_dict(r) for r in b["ranges"]],
                records=b["records"],
                replay=b["replay"],
                output_path=b["output_path"],
            )
            lineage = one if lineage is None or one is None else lineage.merge(one)
        return lineage
