"""ReplayFailedRangesOperator: re-run the failed batches that are due, exactly as planned."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_kafka_backpressure.batch.models import Adoption, BatchMetrics
from airflow_kafka_backpressure.config.pipeline import DEFAULT_STALE_AFTER_S, PipelineConfig
from airflow_kafka_backpressure.ledger.replay_decision import retention_decision, trimmed_plan
from airflow_kafka_backpressure.ledger.topic_identity import RESET_REASON, topic_reset_decision

from ..ledger import BatchRecord, LeaseLost
from .batch import BatchRunningOperator
from .common import as_pipeline, commit_progress, load_executor_target, load_settings


def stale_before_ms(pipeline: PipelineConfig, now_ms: int | None = None) -> int:
    """Batches planned or running with no activity since this time are treated as abandoned."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now - int((pipeline.stale_after_s or DEFAULT_STALE_AFTER_S) * 1000)


def replay_backoff_base_ms(pipeline: PipelineConfig) -> int:
    """The first wait of a batch whose replay failed (it doubles per failure): the replay interval
    (``replay_interval_s``, default 5 batch intervals), so it is tried again about one run later."""
    return int((pipeline.replay_interval_s or 5 * pipeline.batch_interval_s) * 1000)


class ReplayFailedRangesOperator(BatchRunningOperator):
    """Replay the pipeline's failed batches, with the same batch id and sink path.

    Each batch is claimed in the ledger (failed → replaying; a concurrent replayer cannot claim it
    too), run with the plan it was given, and marked replayed once its output is swapped in.

    * **Which batches, in which order** (:mod:`..ledger.replay_queue`): the batches due for a
      replay, in the order they became due, at most ``max_batches``. A failed batch is due from when
      it failed; one whose replays failed ``k`` times in a row (refused by retention or a topic reset
      under ``"fail"``, a poison batch) is due again only a backoff after that (the replay interval,
      doubling per failure, at most an hour). So batches refused every time never fill every run:
      the batches behind them are tried, while the refused ones are still retried now and then.
    * **One failure does not stall the rest**: a batch whose replay fails is marked failed again
      with its error and the loop goes on with the next one. The consumer group is committed to the
      contiguous finished offsets, so it still never passes a failed batch, whatever the order,
      while later batches are written.
    * **Every replayed batch is announced, even when others fail**: Airflow sends a task's Asset
      events only when the task succeeds, and the replayed batches are marked replayed already, so
      failing this task would lose their events (a downstream "one run per batch" DAG would never
      run for them). So batches that could not be replayed do not fail this task: they stay failed
      in the ledger (replayed by a later run), the task logs them as a warning and pushes them as
      XCom ``failed_batches`` (``[{"batch_id", "error"}]``; ``batch_id`` None for a problem of the
      run, such as the consumer-group commit), and a :class:`ReplayCheckOperator` downstream (the
      shipped replay DAG's ``check`` task) fails naming them: the DAG run still fails.
    * **Retention**: before a batch is claimed its ranges are compared with the partitions'
      earliest offsets as the broker reports them (:mod:`..replay_decision`). With
      ``on_data_loss="skip"`` the deleted offsets are recorded as lost and the rest is replayed;
      with ``"fail"`` the batch stays failed with a message naming it and the ``abandon`` command.
    * **Written but not marked**: the last attempt's committed sink output (its manifest names the
      attempt's token and the batch's ranges, every file present) is adopted without reading
      Kafka again — a worker that died between the sink swap and marking the batch.
    """

    ui_color = "#fde8e8"

    def __init__(
        self, *, pipeline: PipelineConfig | dict[str, Any], max_batches: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        self.max_batches = max_batches

    def execute(self, context: Context) -> list[dict[str, Any]]:
        p = self.pipeline
        ledger = self.ledger
        stale = stale_before_ms(p)
        queue = ledger.replay_queue(p.name, stale, backoff_base_ms=replay_backoff_base_ms(p))
        todo = list(queue.due)
        if self.max_batches is not None and len(todo) > self.max_batches:
            self.log.info(
                "Pipeline %s: %s batches are due; this run replays %s (the rest, from batch %s, wait for the "
                "next run)",
                p.name,
                len(todo),
                self.max_batches,
                todo[self.max_batches].batch_id,
            )
            todo = todo[: self.max_batches]
        for batch, due in queue.waiting:
            self.log.info(
                "Batch %s: its replay failed %s time(s) in a row (%s); tried again from %s",
                batch.batch_id,
                batch.replay_failures or 1,
                (batch.error or "its worker died").splitlines()[0][:200],
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(due / 1000)),
            )
        if not todo:
            self.log.info("Nothing to replay for pipeline %s now", p.name)
            return []
        settings = load_settings(p)
        executors = load_executor_target(p, settings)["executors"]
        kafka_props = self.kafka_hook.client_properties()

        replayed: list[dict[str, Any]] = []
        failures: list[tuple[int | None, str]] = []
        try:
            for batch in todo:
                try:
                    done = self._replay_one(ledger, batch, executors, kafka_props, stale)
                except LeaseLost as e:  # another replayer took it: its outcome is theirs
                    self.log.warning("Batch %s: %s", batch.batch_id, e)
                    continue
                except Exception as e:  # noqa: BLE001 - recorded on the batch; the next one goes on
                    message = getattr(e, "job_message", None) or f"{type(e).__name__}: {e}"
                    self.log.error("Replay of batch %s failed: %s", batch.batch_id, message)
                    failures.append((batch.batch_id, message))
                    continue
                if done is not None:
                    replayed.append(done)
        finally:
            if replayed:
                try:
                    with self.kafka_hook.get_conn() as kafka:
                        committed = commit_progress(p, ledger, kafka)
                    self.log.info("Committed group %s: %s", p.group, committed)
                except Exception as e:  # noqa: BLE001 - the batches are replayed: their events must go
                    message = (
                        f"committing consumer group {p.group} failed ({type(e).__name__}: {e}); the next "
                        "record or replay task commits the same offsets"
                    )
                    self.log.error(message)
                    failures.append((None, message))
        self.emit_events(context)
        if failures:
            self.log.warning(
                "%s (their Asset events are sent with this task's success; the check task fails the run)",
                replay_failure_message(p.name, failures, len(todo), len(replayed)),
            )
            context["ti"].xcom_push(
                key=FAILED_BATCHES_KEY, value=[{"batch_id": b, "error": m} for b, m in failures]
            )
        return replayed

    def _replay_one(
        self, ledger: Any, batch: BatchRecord, executors: int, kafka_props: dict[str, Any], stale: int
    ) -> dict[str, Any] | None:
        p = self.pipeline
        self.log.info(
            "Replaying batch %s (%s, planned by run %s): %s",
            batch.batch_id,
            batch.status,
            batch.run_id,
            ", ".join(str(r) for r in batch.ranges if r.count),
        )
        with self.kafka_hook.get_conn() as kafka:
            # a topic deleted and created again: its planned offsets now hold other records
            ids = kafka.topic_ids(list(batch.plan.topic_ids)) if batch.plan.topic_ids else {}
            reset = topic_reset_decision(batch.plan, ids, p.on_topic_reset, ledger_conn_id=p.ledger_conn_id)
            after_reset = trimmed_plan(batch.plan, reset)
            read = [r.tp for r in after_reset.ranges if r.count > 0]
            earliest = kafka.earliest_offsets(read) if read else {}
        decision = retention_decision(after_reset, earliest, p.on_data_loss, ledger_conn_id=p.ledger_conn_id)
        refusal = reset.refusal or decision.refusal
        # A complete committed version of the batch (its worker died between the sink swap and the
        # mark) is adopted, whichever attempt wrote it: it holds every planned offset, so nothing was
        # lost even if retention or a topic reset took them since. With a refusal the job only adopts.
        adopt = Adoption(batch.owner_token or "", batch.plan.ranges, refusal)
        token = self.claim(ledger, batch.batch_id, replay=True, stale_before_ms=stale)
        if refusal is not None:
            metrics = self.run_and_mark(
                ledger, batch.plan, executors, kafka_props, token=token, replay=True, adopt=adopt
            )
            return {
                "batch_id": batch.batch_id,
                "records": metrics.records,
                "processing_ms": metrics.processing_ms,
                "adopted": metrics.adopted,
                "lost": 0,
            }
        plan = trimmed_plan(after_reset, decision)
        if reset.lost:
            self.log.warning(
                "Batch %s: its topic(s) %s were deleted and created again; on_topic_reset='earliest': recording "
                "%s planned offsets (%s) as lost and replaying the rest",
                batch.batch_id,
                sorted({d.topic for d in reset.lost}),
                reset.lost_records,
                ", ".join(map(str, reset.lost)),
            )
        if decision.lost:
            self.log.warning(
                "Batch %s: retention deleted %s planned offsets (%s); on_data_loss='skip': recording them "
                "as lost and replaying the rest",
                batch.batch_id,
                decision.lost_records,
                ", ".join(map(str, decision.lost)),
            )

        def record_losses(metrics: BatchMetrics) -> None:
            if metrics.adopted:  # an adopted version holds those offsets
                return
            for lost, reason in (
                (reset.lost, RESET_REASON),
                (decision.lost, "retention deleted them before the replay"),
            ):
                if lost:
                    ledger.record_losses(batch.batch_id, lost, reason, token=token)

        if plan.records == 0:  # everything was deleted: nothing to read, no Spark job
            now = int(time.time() * 1000)
            metrics = BatchMetrics(batch.batch_id, 0, 0, now, now, now, 0)
            try:
                record_losses(metrics)
            except Exception as e:
                self._mark_failed(ledger, batch.batch_id, token, f"{type(e).__name__}: {e}")
                raise
            self.finish(ledger, plan, metrics, token=token, replay=True)
        else:
            metrics = self.run_and_mark(
                ledger,
                plan,
                executors,
                kafka_props,
                token=token,
                replay=True,
                adopt=adopt,
                before_finish=record_losses,
            )
        return {
            "batch_id": batch.batch_id,
            "records": metrics.records,
            "processing_ms": metrics.processing_ms,
            "adopted": metrics.adopted,
            "lost": 0 if metrics.adopted else decision.lost_records + reset.lost_records,
        }


#: The replay task's XCom key of the batches it could not replay (:class:`ReplayCheckOperator`).
FAILED_BATCHES_KEY = "failed_batches"


def replay_failure_message(
    pipeline: str, failures: Sequence[tuple[int | None, str]], tried: int, replayed: int
) -> str:
    """What could not be replayed, batch by batch (``None``: a problem of the run itself)."""
    batches = sum(b is not None for b, _ in failures)
    return (
        f"{batches} of {tried} batches of pipeline {pipeline!r} could not be replayed ({replayed} replayed; "
        "each failed one stays failed in the ledger, a later replay run tries it again, and the consumer "
        "group stays before the earliest failed one): "
        + "; ".join(f"batch {b}: {m}" if b is not None else m for b, m in failures)
    )


class ReplayFailed(RuntimeError):
    """Some batches could not be replayed (each is failed again with its error in the ledger)."""


class ReplayCheckOperator(BaseOperator):
    """Fails when the replay task (``replay_task_id``) left batches it could not replay, naming each
    with its error; succeeds otherwise. It runs after the replay task in the shipped replay DAG, so
    that the replay task itself succeeds and sends the Asset events of the batches it did replay
    (see :class:`ReplayFailedRangesOperator`), while the DAG run still fails."""

    ui_color = "#fde8e8"

    def __init__(
        self, *, pipeline: PipelineConfig | dict[str, Any], replay_task_id: str = "replay", **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.pipeline = as_pipeline(pipeline)
        self.replay_task_id = replay_task_id

    def execute(self, context: Context) -> None:
        failed = context["ti"].xcom_pull(task_ids=self.replay_task_id, key=FAILED_BATCHES_KEY) or []
        if not failed:
            self.log.info("Task %s replayed every batch it took", self.replay_task_id)
            return
        replayed = context["ti"].xcom_pull(task_ids=self.replay_task_id) or []
        failures = [(f.get("batch_id"), str(f.get("error"))) for f in failed]
        tried = len(replayed) + sum(b is not None for b, _ in failures)
        raise ReplayFailed(replay_failure_message(self.pipeline.name, failures, tried, len(replayed)))
