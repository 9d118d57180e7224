"""Offsets and consumer-group positions from a Kafka cluster, through kafka-python.

No Airflow import: the Airflow hook (:mod:`.hooks.kafka_offsets`) resolves a connection into
client properties and delegates here, and the Spark driver can use it for its bounds check.
Every call is bounded in time; an unreachable cluster or a missing topic raises a clear error.

**Bounds.** kafka-python bounds most calls by its request timeout, but not all: ``committed()`` and
``commit()`` without ``timeout_ms`` retry for ever while the group coordinator is unavailable, and a
metadata refresh waits on the connection's own timeouts. So each call here passes ``timeout_ms`` where
kafka-python takes one, and also runs under a watchdog (:meth:`KafkaOffsets._call`): whatever the
client does, the caller gets :class:`KafkaUnavailableError` naming the call, the broker and the fix
within ``timeout_s`` + :data:`WATCHDOG_GRACE_S`. A client whose call was abandoned is discarded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_kafka_backpressure.batch.models import TopicPartition

from .clients import NoAnswer, SaslLoginRefused, new_client, run_within
from .config import redact, to_kafka_python

#: Seconds the watchdog waits beyond ``timeout_s`` for kafka-python's own timeout to fire first.
WATCHDOG_GRACE_S = 2.0


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
        if not timeout_s > 0:
            raise ValueError(f"{source}: the broker timeout must be > 0 seconds, got {timeout_s!r}")
        self.timeout_ms = max(int(timeout_s * 1000), 1)
        self.config = to_kafka_python(self.properties, source=source)
        self._consumer: Any = None
        self._admin: Any = None
        self._group_consumers: dict[str, Any] = {}

    @property
    def bootstrap(self) -> str:
        return str(self.config["bootstrap_servers"])

    def _sasl_hint(self) -> str:
        """For a connection that logs in with SASL: which login, and that a refused one looks like
        this (a broker closes the connection; the client does not always see the refusal first)."""
        if "SASL" not in str(self.properties.get("security.protocol", "")).upper():
            return ""
        return (
            f" The connection logs in with SASL ({self._sasl_login()}): if the brokers are up, a refused login is the "
            f"likely cause (the broker closes the connection): check sasl.username, sasl.password and "
            f"sasl.mechanism in the extra of {self.source}."
        )

    def _unavailable(self, e: Exception, what: str = "connect") -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"{self.source}: {what}: no Kafka broker answered at {self.bootstrap} within "
            f"{self.timeout_ms / 1000:g}s ({type(e).__name__}: {e}). Check bootstrap.servers and the "
            f"security settings {redact(self.properties)}, and that the brokers are reachable from "
            "this machine; if they are only slow, raise the pipeline's kafka_timeout_s (the hook's timeout_s)."
            + self._sasl_hint()
        )

    def _sasl_login(self) -> str:
        """``sasl.mechanism M, user 'U', security.protocol P`` of the connection (never its password)."""
        props = self.properties
        mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN"))
        return (
            f"sasl.mechanism {mechanism}, user {props.get('sasl.username')!r}, "
            f"security.protocol {props.get('security.protocol')}"
        )

    def _refused(self, e: SaslLoginRefused, what: str) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"{self.source}: {what}: the broker at {self.bootstrap} refused the SASL login "
            f"({self._sasl_login()}): {e}. Fix sasl.username and sasl.password (and sasl.mechanism, "
            f"which must be one the broker enables for this user) in the extra of {self.source}; nothing was "
            "read or committed."
        )

    def _no_answer(self, what: str, cause: BaseException | None = None) -> KafkaUnavailableError:
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return KafkaUnavailableError(
            f"{self.source}: {what}: no answer from the Kafka broker(s) at {self.bootstrap} within "
            f"{self.timeout_ms / 1000:g}s{detail}. The brokers (or the consumer group's coordinator) are "
            "down, frozen or unreachable from this machine: check that the brokers at this address are up "
            "and reachable; if they are only slow, raise the pipeline's kafka_timeout_s (the hook's "
            "timeout_s). Retrying the task is safe." + self._sasl_hint()
        )

    def _new_consumer(self, group_id: str | None, **overrides: Any) -> Any:
        what = "connect" if group_id is None else f"connect for consumer group {group_id!r}"
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        settings = {
            **self.config,
            "request_timeout_ms": max(self.timeout_ms, 1000),
            "bootstrap_timeout_ms": self.timeout_ms,
            **overrides,
        }
        try:
            return self._bounded(
                what,
                lambda: new_client(
                    KafkaConsumer,
                    **settings,
                    group_id=group_id,
                    enable_auto_commit=False,
                    allow_auto_create_topics=False,
                ),
            )
        except KafkaUnavailableError:
            raise
        except SaslLoginRefused as e:
            raise self._refused(e, what) from e
        except KafkaError as e:
            raise self._unavailable(e, what) from e

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = self._new_consumer(None)
        return self._consumer

    @property
    def admin(self) -> Any:
        """An admin client with the same connection settings (group offsets in one request)."""
        if self._admin is None:
            from kafka import KafkaAdminClient
            from kafka.errors import KafkaError

            settings = {k: v for k, v in self.config.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
            settings.update(
                request_timeout_ms=max(self.timeout_ms, 1000), bootstrap_timeout_ms=self.timeout_ms
            )
            try:
                self._admin = self._bounded(
                    "connect (admin)", lambda: new_client(KafkaAdminClient, **settings)
                )
            except KafkaUnavailableError:
                raise
            except SaslLoginRefused as e:
                raise self._refused(e, "connect (admin)") from e
            except KafkaError as e:
                raise self._unavailable(e, "connect (admin)") from e
        return self._admin

    def _group(self, group_id: str) -> Any:
        if not group_id:
            raise ValueError(f"{self.source}: a consumer group id is required")
        if group_id not in self._group_consumers:
            self._group_consumers[group_id] = self._new_consumer(group_id)
        return self._group_consumers[group_id]

    def _bounded(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a watchdog thread: its result or its exception, or
        :class:`KafkaUnavailableError` once ``timeout_s`` + :data:`WATCHDOG_GRACE_S` have passed
        (the stuck call is left to its daemon thread and every client of this object discarded)."""
        try:
            return run_within(self.timeout_ms / 1000 + WATCHDOG_GRACE_S, what, lambda: fn(*args, **kwargs))
        except NoAnswer:
            self._discard()
            raise self._no_answer(what) from None

    def _call(self, what: str, fn, *args: Any, **kwargs: Any) -> Any:
        from kafka.errors import KafkaError, KafkaTimeoutError, RequestTimedOutError

        try:
            return self._bounded(what, fn, *args, **kwargs)
        except (KafkaTimeoutError, RequestTimedOutError) as e:
            raise self._no_answer(what, e) from e
        except KafkaError as e:
            raise KafkaUnavailableError(
                f"{self.source}: {what} failed at {self.bootstrap}: {type(e).__name__}: {e}"
            ) from e

    def _discard(self) -> None:
        """Forget every client (one may be stuck in a call) and close them in the background."""
        clients = [c for c in [self._consumer, *self._group_consumers.values()] if c is not None]
        admin = self._admin
        self._consumer = None
        self._admin = None
        self._group_consumers = {}

        def close_all() -> None:
            for c in clients:
                try:
                    c.close(autocommit=False, timeout_ms=self.timeout_ms)
                except Exception:  # closing is best effort
                    pass
            if admin is not None:
                try:
                    admin.close()
                except Exception:  # closing is best effort
                    pass

        threading.Thread(target=close_all, name="kbp-kafka-close", daemon=True).start()

    # ----- queries ----------------------------------------------------------------------------
    def topics(self) -> set[str]:
        """The topics the cluster shows this client."""
        return set(self._call("list topics", self.consumer.topics))

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

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str | None]:
        """Kafka's topic id (KIP-516) of each of ``topics`` in one Metadata request; None for a topic
        that does not exist. A topic deleted and created again keeps its name, not its id."""
        topics = list(dict.fromkeys(topics))
        if not topics:
            return {}
        described = self._call(f"topic ids of {topics}", lambda: self.admin.describe_topics(topics))
        out: dict[str, str | None] = dict.fromkeys(topics)
        for t in described:
            if t.get("name") in out and not t.get("error_code") and t.get("topic_id"):
                out[t["name"]] = str(t["topic_id"])
        return out

    def _offsets(self, what: str, fn, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        from kafka import TopicPartition as KTP

        tps = list(tps)
        if not tps:
            return {}
        try:
            result = self._call(
                what, fn, [KTP(tp.topic, tp.partition) for tp in tps], timeout_ms=self.timeout_ms
            )
        except (KafkaUnavailableError, KeyError) as e:
            # kafka-python waits out its timeout for a partition whose topic is gone, as for a broker
            # that does not answer (or, once its metadata dropped the topic, fails with a KeyError):
            # ask the cluster which it is before blaming the broker
            self._raise_if_gone({tp.topic for tp in tps}, what)
            if isinstance(e, KeyError):
                raise KafkaUnavailableError(
                    f"{self.source}: {what}: the client found no offsets for {e} at {self.bootstrap}; "
                    "retrying the task is safe"
                ) from e
            raise
        return {TopicPartition(k.topic, k.partition): int(v) for k, v in result.items()}

    def _raise_if_gone(self, topics: set[str], what: str) -> None:
        """:class:`TopicNotFoundError` when the cluster answers and one of ``topics`` is not there."""
        try:  # a fresh Metadata request (the consumer's view of the cluster may lag behind)
            present = set(self._call("list topics", lambda: self.admin.list_topics()))
        except KafkaUnavailableError:
            return  # the broker does not answer: the caller's error stands
        gone = sorted(topics - present)
        if gone:
            raise TopicNotFoundError(
                f"{self.source}: {what}: topic(s) {gone} no longer exist on {self.bootstrap} (deleted since "
                "the ranges were planned, or never created). Their offsets cannot be read: if the topic was "
                "deleted on purpose, give up the batches that read it (`python -m "
                "airflow_kafka_backpressure.ledger abandon --batch N --reason ...` records their offsets as "
                "lost); otherwise recreate it, or fix the pipeline's topic list."
            )

    def earliest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets("earliest offsets", self.consumer.beginning_offsets, tps)

    def latest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets("latest offsets", self.consumer.end_offsets, tps)

    def committed_offsets(self, group_id: str, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets; partitions without a commit are left out.

        One OffsetFetch request for all the partitions (not one per partition: the page's lag of a
        100-partition topic was 100 round trips, each up to the timeout while the coordinator was
        away), bounded by ``timeout_s`` as a whole; retried within that bound while the group's
        coordinator is moving or loading (a retriable error, as a consumer would)."""
        from kafka import TopicPartition as KTP

        if not group_id:
            raise ValueError(f"{self.source}: a consumer group id is required")
        wanted = [KTP(tp.topic, tp.partition) for tp in dict.fromkeys(tps)]
        if not wanted:
            return {}
        what = f"committed offsets of group {group_id!r} ({len(wanted)} partition(s))"
        deadline = time.monotonic() + self.timeout_ms / 1000

        def fetch() -> dict[Any, Any]:
            from kafka.errors import KafkaError

            while True:
                try:
                    return self.admin.list_group_offsets({group_id: wanted}).get(group_id, {})
                except KafkaError as e:
                    if not getattr(e, "retriable", False) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        result = self._call(what, fetch)
        out = {}
        for k, v in result.items():
            offset = getattr(v, "offset", v)
            if offset is not None and offset >= 0:
                out[TopicPartition(k.topic, k.partition)] = int(offset)
        return out

    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` (the next offset to read, Kafka's convention) for ``group_id``."""
        from kafka import TopicPartition as KTP
        from kafka.structs import OffsetAndMetadata

        if not offsets:
            return
        consumer = self._group(group_id)
        payload = {
            KTP(tp.topic, tp.partition): OffsetAndMetadata(int(o), "", -1) for tp, o in offsets.items()
        }
        self._call(f"commit for group {group_id!r}", consumer.commit, payload, timeout_ms=self.timeout_ms)

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
                        if (
                            record.offset >= wanted[ktp]
                            and record.timestamp is not None
                            and record.timestamp >= 0
                        ):
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
        if self._admin is not None:
            try:
                self._admin.close()
            except Exception:  # closing is best effort
                pass
        self._consumer = None
        self._admin = None
        self._group_consumers = {}

    def __enter__(self) -> KafkaOffsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
