"""Step 1 of a batch: its ranges checked against the brokers before anything is read.

A missing topic or partition, a range past the latest offset or below the earliest one, or an
unreachable broker is a :class:`~.errors.JobError` saying what to do (kafka-python, one short-lived
client). Runs in the Spark driver (:mod:`.job`); :func:`range_problems` is pure.

Where the driver is a Spark Connect client (the connect engine), the check starts before the
client session opens (:func:`started_check`) and its answer is awaited where the batch would
check: the client's import and the session's round trips no longer come before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow_kafka_backpressure.batch.models import JobSpec, OffsetRange, TopicPartition
from airflow_kafka_backpressure.kafka.clients import NoAnswer, new_client, run_within, started
from airflow_kafka_backpressure.kafka.config import KafkaConfigError, to_kafka_python
from airflow_kafka_backpressure.kafka.offsets import WATCHDOG_GRACE_S
from airflow_kafka_backpressure.spark.errors import JobError

DEFAULT_BOOTSTRAP_TIMEOUT_MS = 20_000
DEFAULT_REQUEST_TIMEOUT_MS = 30_000


def range_problems(
    ranges: Sequence[OffsetRange],
    partitions: dict[str, set[int]],
    earliest: dict[TopicPartition, int],
    latest: dict[TopicPartition, int],
) -> list[str]:
    """What is wrong with ``ranges`` given the topics' partitions and offsets (pure).

    An empty range is only checked for existing offsets (``until <= latest``): it reads nothing,
    so an old start below the earliest offset does no harm here.
    """
    problems = []
    for r in ranges:
        known = partitions.get(r.topic)
        if not known:
            problems.append(f"{r}: topic {r.topic!r} does not exist")
            continue
        if r.partition not in known:
            problems.append(f"{r}: topic {r.topic!r} has no partition {r.partition} (it has {sorted(known)})")
            continue
        lo, hi = earliest[r.tp], latest[r.tp]
        if r.until_offset > hi:
            problems.append(
                f"{r}: ends past the latest offset {hi} of {r.tp} (earliest {lo}); offsets "
                f"[{max(hi, r.from_offset)}, {r.until_offset}) do not exist yet. The plan is wrong or "
                f"stale: re-plan this batch from the current offsets (until_offset must not exceed "
                f"the latest offset)"
            )
        elif r.count > 0 and r.from_offset < lo:
            problems.append(
                f"{r}: starts below the earliest offset {lo} of {r.tp}; offsets "
                f"[{r.from_offset}, {min(lo, r.until_offset)}) were deleted (retention) before they "
                f"were read. Re-plan this batch from offset {lo} and record the data loss"
            )
    return problems


def _ask_brokers(
    cfg: dict[str, Any], ranges: Sequence[OffsetRange]
) -> tuple[dict[str, set[int]], dict[Any, int], dict[Any, int]]:
    """The topics' partitions and the ranges' earliest and latest offsets, from the brokers."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTP

    servers = cfg["bootstrap_servers"]
    try:
        consumer = new_client(KafkaConsumer, **cfg)
    except Exception as e:
        raise JobError(
            f"cannot reach Kafka at {servers!r} within {cfg['bootstrap_timeout_ms']} ms "
            f"({type(e).__name__}: {e}). Check bootstrap.servers, the network and the security "
            f"settings of the connection; set socket.connection.setup.timeout.ms to wait longer"
        ) from e
    try:
        partitions: dict[str, set[int]] = {}
        for topic in sorted({r.topic for r in ranges}):
            # Existence first: asking offsets of an unknown topic may auto-create it.
            partitions[topic] = set(consumer.partitions_for_topic(topic) or ())
        tps = [r.tp for r in ranges if r.partition in partitions.get(r.topic, ())]
        ktps = [KafkaTP(*tp) for tp in tps]
        try:
            lo = consumer.beginning_offsets(ktps) if ktps else {}
            hi = consumer.end_offsets(ktps) if ktps else {}
        except Exception as e:
            raise JobError(
                f"cannot list the earliest/latest offsets of {', '.join(map(str, tps))} at "
                f"{servers!r}: {type(e).__name__}: {e}. Check the broker's health and the "
                f"connection's permissions (Describe on the topics)"
            ) from e
    finally:
        consumer.close()
    return partitions, lo, hi


def _client_config(spec: JobSpec) -> dict[str, Any]:
    try:
        cfg = to_kafka_python(spec.kafka, source="JobSpec.kafka")
    except KafkaConfigError as e:
        raise JobError(str(e)) from e
    cfg.setdefault("bootstrap_timeout_ms", DEFAULT_BOOTSTRAP_TIMEOUT_MS)
    cfg.setdefault("request_timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
    cfg.setdefault("client_id", f"kbp-job-{spec.plan.pipeline}")
    cfg.update(group_id=None, enable_auto_commit=False, allow_auto_create_topics=False)
    return cfg


def check_bounds(spec: JobSpec) -> dict[TopicPartition, tuple[int, int]]:
    """Check the plan's ranges against the brokers; (earliest, latest) per topic-partition.

    Raises :class:`JobError` for an unreachable broker (after ``bootstrap_timeout_ms``), a missing
    topic or partition, or a range outside ``[earliest, latest]``. The whole conversation is
    bounded (:func:`~airflow_kafka_backpressure.kafka.clients.run_within`): the bootstrap's timeout
    and three request timeouts and the watchdog's grace, whatever kafka-python waits on (a broker that accepted the TLS
    connection and then froze answers no handshake, and kafka-python does not time that out).
    """
    ranges = spec.plan.ranges
    if not ranges:
        return {}
    cfg = _client_config(spec)
    servers = cfg["bootstrap_servers"]
    limit_s = (cfg["bootstrap_timeout_ms"] + 3 * cfg["request_timeout_ms"]) / 1000 + WATCHDOG_GRACE_S
    try:
        partitions, lo, hi = run_within(limit_s, "bounds check", lambda: _ask_brokers(cfg, ranges))
    except NoAnswer:
        raise JobError(
            f"no answer from Kafka at {servers!r} within {limit_s:.0f} s while checking the ranges of batch "
            f"{spec.plan.batch_id} of pipeline {spec.plan.pipeline!r}: a broker accepted the connection but "
            "does not answer (frozen, overloaded, or a TLS handshake that never completes). Nothing was "
            "written; check the brokers' health, then replay the batch"
        ) from None
    tps = [r.tp for r in ranges if r.partition in partitions.get(r.topic, ())]
    earliest = {TopicPartition(k.topic, k.partition): int(v) for k, v in lo.items()}
    latest = {TopicPartition(k.topic, k.partition): int(v) for k, v in hi.items()}
    problems = range_problems(ranges, partitions, earliest, latest)
    if problems:
        raise JobError(
            f"batch {spec.plan.batch_id} of pipeline {spec.plan.pipeline!r} at {servers!r} cannot be "
            "read; nothing was written. " + "; ".join(problems)
        )
    return {tp: (earliest[tp], latest[tp]) for tp in tps}


def started_check(spec: JobSpec) -> Callable[[], dict[TopicPartition, tuple[int, int]]]:
    """:func:`check_bounds` of ``spec`` started now, in a daemon thread; the returned call waits
    for it and returns its answer or raises its error (the check bounds its own time)."""
    answer = started(f"bounds check of batch {spec.plan.batch_id}", lambda: check_bounds(spec))
    return lambda: answer(None)
