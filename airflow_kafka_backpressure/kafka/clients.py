"""kafka-python clients that do not outlive a failed start.

kafka-python 3 starts a client's network thread before it bootstraps; when bootstrapping fails
(broker down, wrong address, bad security settings) the constructor raises and that thread runs on,
reconnecting and logging "No node available" for the life of the process. Every failed attempt adds
one: a triggerer, a readiness probe or a Python worker that keeps trying a down broker gathers
threads, connections and log lines without end. :func:`new_client` builds the client and, if the
constructor raises, closes the network client it had started.

A wrong SASL password does not reach the caller either: kafka-python 3 logs the broker's refusal
("Bootstrap connection to … failed: SaslAuthenticationFailedError …") and retries until its
bootstrap times out, raising only "Unable to bootstrap". :func:`new_client` watches kafka-python's
log while the constructor runs and, if a SASL login was refused, raises
:class:`SaslLoginRefused` with the broker's own words instead.

:func:`run_within` bounds a whole conversation with the brokers: kafka-python bounds its requests,
but not every wait before one (a TLS handshake with a broker that accepted the connection and
then stopped answering waits for ever). :func:`started` runs one beside the caller, awaited later.

No Airflow or Spark imports (the Spark job and the Airflow worker both use it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class SaslLoginRefused(RuntimeError):
    """The broker refused the client's SASL login (wrong user, password or mechanism)."""


class NoAnswer(Exception):
    """A call given to :func:`run_within` had not ended when its time was up."""


def started(name: str, fn: Callable[[], T]) -> Callable[[float | None], T]:
    """``fn()`` started now in a daemon thread named after ``name``; the returned call waits for it
    (at most its argument's seconds; None: until it ends) and gives its result, raises its
    exception, or raises :class:`NoAnswer` when the time is up (the call is left to its thread)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"kbp-kafka-{name[:40]}", daemon=True).start()

    def answer(timeout_s: float | None = None) -> T:
        if not done.wait(timeout_s):
            raise NoAnswer(f"{name}: no answer within {timeout_s:.0f} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    return answer


def run_within(timeout_s: float, name: str, fn: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread: its result, or its exception, or :class:`NoAnswer` once
    ``timeout_s`` have passed (the call is left to its thread; close or discard what it uses)."""
    return started(name, fn)(timeout_s)


class _RefusedLogins(logging.Handler):
    """Collects the SASL refusals kafka-python logs (its log records carry the exception)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.refusals: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        from kafka.errors import SaslAuthenticationFailedError

        args = record.args if isinstance(record.args, tuple) else ()
        self.refusals.extend(a for a in args if isinstance(a, SaslAuthenticationFailedError))


def new_client(cls: Callable[..., T], *args: Any, **config: Any) -> T:
    """``cls(*args, **config)`` — a kafka-python ``KafkaConsumer``, ``KafkaProducer`` or
    ``KafkaAdminClient`` — whose network client is closed if the constructor raises.

    kafka-python 3.0 builds its cluster metadata without the client's ``allow_auto_create_topics``
    (3.0.12: every Metadata request allows auto-creation), so a consumer asking the offsets of a
    topic deleted meanwhile made a broker with ``auto.create.topics.enable`` (Kafka's default)
    create it again, with the broker's default partition count. The setting is handed to the
    metadata here."""
    try:
        from kafka.net.compat import KafkaNetClient
    except ImportError:  # kafka-python 2: no background network thread to leak
        return cls(*args, **config)
    started: list[Any] = []

    def network_client(**kw: Any) -> Any:
        client = KafkaNetClient(**kw)
        started.append(client)
        metadata_config = getattr(getattr(getattr(client, "_manager", None), "cluster", None), "config", None)
        if "allow_auto_create_topics" in kw and isinstance(metadata_config, dict):
            metadata_config["allow_auto_create_topics"] = bool(kw["allow_auto_create_topics"])
        return client

    watched = logging.getLogger("kafka.net")
    refused = _RefusedLogins()
    sasl = "SASL" in str(config.get("security_protocol", "")).upper()
    if sasl:
        watched.addHandler(refused)
    try:
        return cls(*args, kafka_client=network_client, **config)
    except BaseException as e:
        for client in started:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the constructor's error is the one to report
                pass
        if refused.refusals and isinstance(e, Exception):
            raise SaslLoginRefused(str(refused.refusals[-1])) from e
        raise
    finally:
        if sasl:
            watched.removeHandler(refused)
