"""SparkKafkaBatchOperator: run the planned batch as a bounded Spark job."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context

from airflow_kafka_backpressure.batch.models import BatchMetrics, BatchPlan
from airflow_kafka_backpressure.ledger.topic_identity import changed_topics, reset_refusal

from ..ledger import PLANNED, InvalidTransition
from .batch import BatchRunningOperator
from .common import load_executor_target, load_settings
from .plan import TopicResetError


class SparkKafkaBatchOperator(BatchRunningOperator):
    """Run the batch planned for this DAG run on Spark (the pipeline's engine) and return its metrics.

    The plan is the ledger's for (pipeline, run id). The executor count is the pipeline's executor
    target Variable. The batch is marked running, then succeeded — only after the sink swap — or
    failed with what happened (the job's error, a timeout, a kill), which makes it replayable.
    """

    ui_color = "#fdf1e3"

    def _check_topics(self, plan: BatchPlan) -> None:
        """A topic of the plan deleted and created again since it was planned (a rerun of an old run,
        or a recreation between plan and ingest): its planned offsets now hold other records, so the
        batch must not read them. The replay DAG applies ``on_topic_reset`` to a failed batch."""
        if not plan.topic_ids:
            return  # planned before topic ids were recorded
        with self.kafka_hook.get_conn() as kafka:
            current = kafka.topic_ids(list(plan.topic_ids))
        changed = changed_topics(plan.topic_ids, current)
        if changed:
            raise TopicResetError(
                reset_refusal(
                    self.pipeline.name,
                    changed,
                    f"read for batch {plan.batch_id}",
                    self.pipeline.on_topic_reset,
                )
            )

    def execute(self, context: Context) -> dict[str, Any]:
        p = self.pipeline
        ledger = self.ledger
        plan = ledger.get_plan(p.name, context["run_id"])
        if plan is None:
            raise RuntimeError(
                f"No batch is planned for run {context['run_id']!r} of pipeline {p.name!r}: run the plan task first."
            )
        try:
            settings = load_settings(p)
            executors = load_executor_target(p, settings)["executors"]
            kafka_props = self.kafka_hook.client_properties()
            self._check_topics(plan)
        except Exception as e:  # the batch is replayable now, unless another attempt holds it
            try:
                ledger.mark_failed(
                    plan.batch_id, f"before the job started: {type(e).__name__}: {e}", only_from=(PLANNED,)
                )
            except InvalidTransition as not_ours:  # replaying, running, or done: the error below is the news
                self.log.warning("%s", not_ours)
            raise

        token = self.claim(ledger, plan.batch_id, replay=False, executors=executors)
        if plan.records == 0:
            # nothing to read: no Spark application for an idle topic, the batch is done
            now = int(time.time() * 1000)
            metrics = BatchMetrics(plan.batch_id, 0, 0, now, now, now, 0)
            self.finish(ledger, plan, metrics, token=token, replay=False)
            self.log.info("Batch %s is empty: no job submitted", plan.batch_id)
        else:
            metrics = self.run_and_mark(ledger, plan, executors, kafka_props, token=token, replay=False)
        self.emit_events(context)
        return metrics.to_xcom()
