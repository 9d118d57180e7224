"""Offsets and consumer-group positions from a Kafka cluster, through kafka-python.

No Airflow import: the Airflow hook (:mod:`.hooks.kafka_offsets`) resolves a connection into
client properties and delegates here, and the Spark driver can use it for its bounds check.
Every call is bounded in time; an unreachable cluster or a missing topic raises a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from .kafka_config import redact, to_kafka_python
from .models import TopicPartition


class KafkaUnavailableError(RuntimeError):
    pass


class TopicNotFoundError(LookupError):
    pass


class KafkaOffsets:
    """Short-lived offset queries and group commits. A context manager; close() ends connections.

    :param properties: librdkafka-style client properties (``bootstrap.servers`` …).
    :param source: names where the properties came from (e.g. a connection id) in error messages.
    :param timeout_s: bound for connecting and for each request.
    """

    def __init__(self, properties: Mapping[str, Any], *, source: str = "Kafka", timeout_s: float = 10.0):
        self.properties = dict(properties)
        self.source = source
        self.timeout_ms = max(int(timeout_s * 1000), 1)
        self.config = to_kafka_python(self.properties, source=source)
        self._consumer: Any = None
        self._group_consumers: dict[str, Any] = {}

    @property
    def bootstrap(self) -> str:
        return str(self.config["bootstrap_servers"])

    def _unavailable(self, e: Exception) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"{self.source}: no Kafka broker answered at {self.bootstrap} within "
            f"{self.timeout_ms / 1000:g}s ({type(e).__name__}: {e}). Check bootstrap.servers and the "
            f"security settings {redact(self.properties)}, and that the brokers are reachable from "
            "this machine."
        )

    def _new_consumer(self, group_id: str | None, **overrides: Any) -> Any:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        try:
            settings = {
                **self.config,
                "request_timeout_ms": max(self.timeout_ms, 1000),
                "bootstrap_timeout_ms": self.timeout_ms,
                **overrides,
            }
            return KafkaConsumer(
                **settings, group_id=group_id, enable_auto_commit=False, allow_auto_create_topics=False
            )
        except KafkaError as e:
            raise self._unavailable(e) from e

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = self._new_consumer(None)
        return self._consumer

    def _group(self, group_id: str) -> Any:
        if not group_id:
            raise ValueError(f"{self.source}: a consumer group id is required")
        if group_id not in self._group_consumers:
            self._group_consumers[group_id] = self._new_consumer(group_id)
        return self._group_consumers[group_id]

    def _call(self, what: str, fn, *args):
        from kafka.errors import KafkaError

        try:
            return fn(*args)
        except KafkaError as e:
            raise KafkaUnavailableError(
                f"{self.source}: {what} failed at {self.bootstrap}: {type(e).__name__}: {e}"
            ) from e

    # ----- queries ----------------------------------------------------------------------------
    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        """All partitions of ``topics``; :class:`TopicNotFoundError` names the missing ones."""
        topics = list(dict.fromkeys(topics))
        if not topics:
            raise ValueError(f"{self.source}: no topics given")
        found: list[TopicPartition] = []
        missing = []
        for topic in topics:
            parts = self._call(f"metadata for topic {topic!r}", self.consumer.partitions_for_topic, topic)
            if not parts:
                missing.append(topic)
            else:
                found.extend(TopicPartition(topic, p) for p in sorted(parts))
        if missing:
            raise TopicNotFoundError(
                f"{self.source}: topic(s) {missing} do not exist on {self.bootstrap}. Create them, or "
                "fix the pipeline's topic list."
            )
        return found

    def _offsets(self, what: str, fn, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        from kafka import TopicPartition as KTP

        tps = list(tps)
        if not tps:
            return {}
        result = self._call(what, fn, [KTP(tp.topic, tp.partition) for tp in tps])
        return {TopicPartition(k.topic, k.partition): int(v) for k, v in result.items()}

    def earliest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets("earliest offsets", self.consumer.beginning_offsets, tps)

    def latest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets("latest offsets", self.consumer.end_offsets, tps)

    def committed_offsets(self, group_id: str, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets; partitions without a commit are left out."""
        from kafka import TopicPartition as KTP

        consumer = self._group(group_id)
        out = {}
        for tp in tps:
            offset = self._call(
                f"committed offset of group {group_id!r} for {tp}", consumer.committed, KTP(tp.topic, tp.partition)
            )
            if offset is not None and offset >= 0:
                out[tp] = int(offset)
        return out

    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` (the next offset to read, Kafka's convention) for ``group_id``."""
        from kafka import TopicPartition as KTP
        from kafka.structs import OffsetAndMetadata

        if not offsets:
            return
        consumer = self._group(group_id)
        payload = {KTP(tp.topic, tp.partition): OffsetAndMetadata(int(o), "", -1) for tp, o in offsets.items()}
        self._call(f"commit for group {group_id!r}", consumer.commit, payload)

    def record_timestamps(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The Kafka timestamp (epoch ms) of the first record at or after each offset.

        One bounded read of a few KB per partition; partitions with no record there within the
        timeout (or only records without a timestamp) are left out."""
        from kafka import TopicPartition as KTP

        if not offsets:
            return {}
        wanted = {KTP(tp.topic, tp.partition): int(o) for tp, o in offsets.items()}
        reader = self._new_consumer(None, max_partition_fetch_bytes=16 * 1024)  # one record is enough
        found: dict[TopicPartition, int] = {}
        try:
            self._call("assign for timestamps", reader.assign, list(wanted))
            for ktp, offset in wanted.items():
                reader.seek(ktp, offset)
            deadline = time.monotonic() + self.timeout_ms / 1000
            while len(found) < len(wanted) and time.monotonic() < deadline:
                remaining_ms = max(int((deadline - time.monotonic()) * 1000), 1)
                batches = self._call("fetch for timestamps", reader.poll, min(remaining_ms, 500))
                for ktp, records in batches.items():
                    tp = TopicPartition(ktp.topic, ktp.partition)
                    if tp in found:
                        continue
                    for record in records:
                        if record.offset >= wanted[ktp] and record.timestamp is not None and record.timestamp >= 0:
                            found[tp] = int(record.timestamp)
                            break
                    if tp in found:
                        reader.pause(ktp)
        finally:
            try:
                reader.close(autocommit=False)
            except Exception:  # closing is best effort
                pass
        return found

    def lag(self, group_id: str, topics: Iterable[str]) -> dict[TopicPartition, int]:
        """Records not yet committed by ``group_id``: latest - committed (latest - earliest if none)."""
        tps = self.partitions(topics)
        latest = self.latest_offsets(tps)
        committed = self.committed_offsets(group_id, tps)
        earliest = self.earliest_offsets([tp for tp in tps if tp not in committed])
        return {tp: max(latest[tp] - committed.get(tp, earliest.get(tp, 0)), 0) for tp in tps}

    def close(self) -> None:
        for c in [self._consumer, *self._group_consumers.values()]:
            if c is not None:
                try:
                    c.close(autocommit=False)
                except Exception:  # closing is best effort
                    pass
        self._consumer = None
        self._group_consumers = {}

    def __enter__(self) -> KafkaOffsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
