"""A topic deleted and created again (pure: no Airflow, Spark or Kafka import).

Kafka names a topic by its name but identifies it by its topic id (KIP-516). A topic deleted and
created again keeps the name and gets a new id, and its offsets start again from 0. Offsets the
ledger holds for the old topic then point at other records of the new one: planning on from the old
head would skip the new topic's first records, a replay of an old batch would read the new topic's
records at the old offsets, and a commit would put old watermarks on the new topic.

Every plan records the ids of the topics it read (``BatchPlan.topic_ids``). The plan task compares
them with the broker's, and so do a rerun of a stored plan, a replay and the group commit. On a
change, the pipeline's ``on_topic_reset`` decides:

* ``"fail"`` (default) — nothing is planned, replayed or committed for the topic; the error names
  the topic, both ids and the choices.
* ``"earliest"`` — the new topic is read from its earliest offset. The replay DAG records the old
  topic's offsets of unfinished batches as lost (kind ``replay``, reason "topic recreated") and
  replays the rest of them; once none is left, the plan task keeps the old topic's ledger rows under
  an archived name (:func:`archived_name`) and starts the new topic's chains.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange
from airflow_kafka_backpressure.control.allocation import ON_TOPIC_RESET
from airflow_kafka_backpressure.ledger.commands import abandon_command
from airflow_kafka_backpressure.ledger.replay_decision import ReplayDecision

__all__ = ["ON_TOPIC_RESET", "archived_name", "changed_topics", "reset_refusal", "topic_reset_decision"]

#: The reason recorded with the offsets a topic reset gave up.
RESET_REASON = "the topic was deleted and created again before these offsets were read"


def changed_topics(known: Mapping[str, str], current: Mapping[str, str | None]) -> dict[str, tuple[str, str]]:
    """Topics whose id on the broker differs from the one recorded: ``{topic: (recorded, now)}``.
    A topic with no recorded id (never planned, or planned before ids were kept) or missing on the
    broker now (its own error elsewhere) is not a change."""
    return {t: (known[t], now) for t, now in current.items() if now and known.get(t) and known[t] != now}


def archived_name(topic: str, old_id: str) -> str:
    """The name the ledger keeps an old topic's rows under: ``#`` is not allowed in Kafka topic
    names, so no real topic meets them; at most 249 characters, as the ledger's column."""
    return f"{topic[:240]}#{old_id[:8]}"


def reset_refusal(
    pipeline: str, changed: Mapping[str, tuple[str, str]], where: str, policy: str = "fail"
) -> str:
    """The error when ``changed`` topics stop ``where`` (planned, read for batch N, committed)."""
    topics = ", ".join(
        f"{t!r} (id {old} when planned, {new} now)" for t, (old, new) in sorted(changed.items())
    )
    head = (
        f"Pipeline {pipeline!r}: topic(s) {topics} were deleted and created again: their offsets started "
        f"again from 0, so the offsets the ledger holds no longer point at the records they did. Nothing was "
        f"{where}."
    )
    if policy == "earliest":
        return head + (
            " The batch is failed; the replay DAG records its offsets of those topics as lost and replays the "
            "rest (on_topic_reset='earliest')."
        )
    return head + (
        " on_topic_reset='fail' stops here. To read the new topic from its earliest offset and record the old "
        'topic\'s unread offsets as lost, set "on_topic_reset": "earliest" in the pipelines file; to keep '
        "the old data, restore the topic (a new topic cannot bring the old offsets back)."
    )


def topic_reset_decision(
    plan: BatchPlan,
    current: Mapping[str, str | None],
    on_topic_reset: str,
    *,
    ledger_conn_id: str | None = None,
) -> ReplayDecision:
    """What a replay (or a rerun) does with ``plan`` given the topics' ids now: ranges of a topic
    whose id changed cannot be read any more (their offsets hold other records). ``"earliest"``:
    they are lost and the rest is read; ``"fail"``: a refusal naming the batch and the way out."""
    if on_topic_reset not in ON_TOPIC_RESET:
        raise ValueError(f"on_topic_reset must be one of {ON_TOPIC_RESET}, got {on_topic_reset!r}")
    changed = changed_topics(plan.topic_ids, {t: current.get(t) for t in plan.topic_ids})
    if not changed:
        return ReplayDecision((), tuple(plan.ranges))
    lost = tuple(
        DataLoss(r.topic, r.partition, r.from_offset, r.until_offset)
        for r in plan.ranges
        if r.topic in changed and r.count > 0
    )
    ranges = tuple(
        OffsetRange(r.topic, r.partition, r.until_offset, r.until_offset) if r.topic in changed else r
        for r in plan.ranges
    )
    if on_topic_reset == "earliest":
        return ReplayDecision(lost, ranges)
    reason = "its topic was deleted and created again before it was read"
    refusal = (
        reset_refusal(plan.pipeline, changed, f"read for batch {plan.batch_id}")
        + f" To give this batch's offsets of those topics up, run: {abandon_command(plan.batch_id, ledger_conn_id, reason=reason)}"
    )
    return ReplayDecision(lost, ranges, refusal)
