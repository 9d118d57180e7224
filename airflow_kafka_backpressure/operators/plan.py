"""PlanOffsetRangesOperator: the next batch's offset ranges, sized by the controller."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context

from airflow_kafka_backpressure.batch.fault_points import after_plan
from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.config.sink_placement import sink_refusal
from airflow_kafka_backpressure.ledger.topic_identity import archived_name, changed_topics, reset_refusal

from ..control.allocation import plan_ranges, starting_positions
from ..control.controller import PlanDecision, Waiting, wait_for_data
from ..control.cost_mode import ARRIVAL_WINDOW_PLANS, PlanInputs, arrival_rate
from ..hooks.spark_batch import SparkBatchHook
from ..ledger import Ledger
from .base import PipelineOperator
from .common import (
    load_controller,
    load_executor_target,
    load_settings,
    refuse_backfill,
    save_controller,
    state_lock,
)


def recent_plans(ledger: Ledger, pipeline: PipelineConfig) -> list[Any]:
    """The last plans, newest first (their lag and latest offsets give the arrival rate)."""
    return ledger.recent_batches(pipeline.name, limit=ARRIVAL_WINDOW_PLANS)


def arrivals_history(plans: list[Any], now_ms: int, latest_total: int) -> list[tuple[int, int]]:
    """``(time, latest offsets summed)`` at each recent plan and now: ``sum(until) + lag`` of a plan
    is the broker's latest offsets when it was made."""
    points = [
        (b.plan.planned_at_ms, sum(r.until_offset for r in b.plan.ranges) + b.plan.lag)
        for b in plans
        if b.plan.lag is not None
    ]
    return sorted(points) + [(now_ms, latest_total)]


class SinkRefused(RuntimeError):
    """The pipeline's sink cannot hold its guarantees where the batches run (the message says why)."""


class TopicResetError(RuntimeError):
    """A topic of the pipeline was deleted and created again and ``on_topic_reset`` is ``"fail"``."""


class PlanOffsetRangesOperator(PipelineOperator):
    """Plan the batch of this DAG run and return it (XCom).

    Positions come from the ledger (the end of each partition's last range); a partition never
    planned starts at the consumer group's committed offset, else at ``starting_offsets``. The
    broker gives earliest and latest offsets. The settings' ``mode`` sizes the batch: ``spark``
    with the PID's rate limit, ``cost`` with the cost model's budget for the lag, the arrival rate
    and the executor target; Spark's per-partition rules and the settings' limits (with
    ``max_records_per_batch``) split it into ranges. The plan is stored under (pipeline, run id): a
    retry, a cleared task or a rerun of the same run returns the stored plan and never computes a
    new range.

    With ``min_records_per_batch``, a run that finds fewer records available skips (this task and so
    the Spark job, the record and scale tasks): nothing is planned or committed and the sink Asset
    gets no event, until ``max_batch_delay_s`` has passed since the last batch's plan. The controller
    state's ``waiting`` says so (the page shows "waiting for data").
    """

    ui_color = "#e8f4fd"

    def _executors(self, settings: Any) -> int:
        try:
            return int(load_executor_target(self.pipeline, settings)["executors"])
        except ValueError as e:  # the ingest task fails on it (and marks the batch replayable)
            self.log.warning("Planning for %s executor(s): %s", settings.initial_executors, e)
            return int(settings.initial_executors)

    def execute(self, context: Context) -> dict[str, Any]:
        p = self.pipeline
        refuse_backfill(p, context["dag_run"])  # before anything is written
        run_id = context["run_id"]
        ledger = self.ledger

        stored = ledger.get_plan(p.name, run_id)
        if stored is not None:
            self.log.info("Run %s already has batch %s: reusing its ranges", run_id, stored.batch_id)
            return stored.to_xcom()

        refusal = sink_refusal(p, SparkBatchHook.for_pipeline(p).spark_master())
        if refusal:
            raise SinkRefused(refusal)
        settings = load_settings(p)  # an invalid edit fails here, before anything is written
        controller = load_controller(p, settings)

        with self.kafka_hook.get_conn() as kafka:
            tps = kafka.partitions(p.topics)
            topic_ids = kafka.topic_ids(p.topics)
            reset = self._topic_resets(ledger, topic_ids)
            earliest = kafka.earliest_offsets(tps)
            latest = kafka.latest_offsets(tps)
            heads = {tp: o for tp, o in ledger.heads(p.name).items() if tp.topic in p.topics}
            new = [tp for tp in tps if tp not in heads]
            committed = (
                kafka.committed_offsets(p.group, [tp for tp in new if tp.topic not in reset]) if new else {}
            )
            # a topic created again starts at its earliest offset, whatever the group held for the old one
            committed.update({tp: earliest[tp] for tp in new if tp.topic in reset})

        now_ms = int(time.time() * 1000)
        current, _ = starting_positions(heads, earliest, latest, committed, p.starting_offsets)
        lag = sum(max(latest[tp] - max(current[tp], earliest[tp]), 0) for tp in latest)
        plans = recent_plans(ledger, p)
        waiting = wait_for_data(
            lag,
            self._min_records(settings, controller),
            settings.max_batch_delay_s,
            plans[0].plan.planned_at_ms if plans else None,
            now_ms,
        )
        if waiting is not None:
            self._skip(settings, waiting)
        decision = self._decide(controller, settings, lag, plans, latest, now_ms)
        allocation = plan_ranges(
            heads,
            earliest,
            latest,
            batch_interval_ms=p.batch_interval_ms,
            limits=settings.rate_limits(tps),
            latest_rate=decision.rate if settings.backpressure_enabled else None,
            committed=committed,
            starting_offsets=p.starting_offsets,
            on_data_loss=p.on_data_loss,
        )
        for loss in allocation.data_loss:
            self.log.warning(
                "Data loss on %s-%s: offsets [%s, %s) were deleted by retention before they were read",
                loss.topic,
                loss.partition,
                loss.from_offset,
                loss.until_offset,
            )
        lag_after = sum(latest[r.tp] - r.until_offset for r in allocation.ranges)
        plan = ledger.record_plan(
            p.name,
            run_id,
            allocation.ranges,
            p.sink,
            p.batch_interval_ms,
            now_ms,
            allocation.rate_limit,
            allocation.data_loss,
            lag=lag_after,
            lease_ms=int(p.planned_lease_s * 1000),
            topic_ids={t: i for t, i in topic_ids.items() if i},
        )
        self.log.info(
            "Batch %s: %s records over %s partitions (mode %s, rate limit %s records/s, %s records left "
            "behind): %s",
            plan.batch_id,
            plan.records,
            len(plan.ranges),
            decision.mode,
            allocation.rate_limit,
            lag_after,
            decision.reason if settings.backpressure_enabled else "backpressure_enabled is false",
        )
        after_plan(p.name, plan.batch_id)  # a no-op outside the fault tests
        warning = controller.warning(p.batch_interval_s)
        if warning:
            self.log.warning("Pipeline %s: %s", p.name, warning)
        self._remember(settings, {**decision.to_dict(), "batch_id": plan.batch_id, "planned_at_ms": now_ms})
        return plan.to_xcom()

    def _remember(self, settings: Any, last_plan: dict[str, Any]) -> None:
        """Keep what planned in the controller state (under its lock): the page shows the active
        mode's figure and regime from it, and a run that plans is no longer waiting for data."""
        p = self.pipeline
        with state_lock(p, self.ledger, p.controller_variable):
            controller = load_controller(p, settings)
            controller.last_plan, controller.waiting = last_plan, None
            save_controller(p, controller, settings)

    def _min_records(self, settings: Any, controller: Any) -> int:
        """``min_records_per_batch``, or more where the active mode asks for more (the cost mode
        with ``min_batch_fixed_share``: the batch whose fitted fixed cost is at most that share of
        its time), never above the cap."""
        return int(controller.min_records(settings, self._executors(settings)))

    def _skip(self, settings: Any, waiting: Waiting) -> None:
        """Record the wait in the controller state (under its lock) and skip the run."""
        from airflow.sdk.exceptions import AirflowSkipException

        p = self.pipeline
        with state_lock(p, self.ledger, p.controller_variable):
            controller = load_controller(p, settings)
            controller.waiting = waiting
            save_controller(p, controller, settings)
        self.log.info("Pipeline %s: %s", p.name, waiting.reason())
        raise AirflowSkipException(waiting.reason())

    def _topic_resets(self, ledger: Ledger, topic_ids: dict[str, str | None]) -> set[str]:
        """Topics deleted and created again since the newest plan (their ids changed): refused with
        ``on_topic_reset="fail"``; with ``"earliest"`` their old ledger rows are archived so that the
        new topic starts afresh (refused while unfinished batches still read the old one)."""
        p = self.pipeline
        changed = changed_topics(ledger.known_topic_ids(p.name), topic_ids)
        if not changed:
            return set()
        if p.on_topic_reset == "fail":
            raise TopicResetError(reset_refusal(p.name, changed, "planned"))
        for topic, (old, new) in sorted(changed.items()):
            archived = archived_name(topic, old)
            moved = ledger.reset_topic(p.name, topic, archived)
            self.log.warning(
                "Pipeline %s: topic %r was deleted and created again (id %s -> %s); on_topic_reset='earliest': "
                "its %s old ranges are kept as %r and the new topic is read from its earliest offset. Offsets "
                "of the old topic that were never planned cannot be counted any more.",
                p.name,
                topic,
                old,
                new,
                moved,
                archived,
            )
        return set(changed)

    def _decide(
        self,
        controller: Any,
        settings: Any,
        lag: int,
        plans: list[Any],
        latest: dict[TopicPartition, int],
        now_ms: int,
    ) -> PlanDecision:
        """The controller's rate for this batch: the PID's, or the cost model's budget as a rate."""
        p = self.pipeline
        last = plans[0].plan if plans else None
        return controller.plan(
            settings.cost_params(),
            PlanInputs(
                lag=lag,
                batch_interval_s=p.batch_interval_s,
                executors=self._executors(settings),
                arrivals_per_s=arrival_rate(arrivals_history(plans, now_ms, sum(latest.values()))),
                previous_budget=None
                if last is None or last.rate is None
                else int(last.rate * p.batch_interval_s),
                draining=last is not None and (last.lag or 0) > 0,
            ),
        )
