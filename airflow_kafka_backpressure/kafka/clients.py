"""kafka-python clients that do not outlive a failed start.

kafka-python 3 starts a client's network thread before it bootstraps; when bootstrapping fails
(broker down, wrong address, bad security settings) the constructor raises and that thread runs on,
reconnecting and logging "No node available" for the life of the process. Every failed attempt adds
one: a triggerer, a readiness probe or a Python worker that keeps trying a down broker gathers
threads, connections and log lines without end. :func:`new_client` builds the client and, if the
constructor raises, closes the network client it had started.

No Airflow or Spark imports (the Spark job and the Airflow worker both use it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def new_client(cls: Callable[..., T], *args: Any, **config: Any) -> T:
    """``cls(*args, **config)`` — a kafka-python ``KafkaConsumer``, ``KafkaProducer`` or
    ``KafkaAdminClient`` — whose network client is closed if the constructor raises."""
    try:
        from kafka.net.compat import KafkaNetClient
    except ImportError:  # kafka-python 2: no background network thread to leak
        return cls(*args, **config)
    started: list[Any] = []

    def network_client(**kw: Any) -> Any:
        client = KafkaNetClient(**kw)
        started.append(client)
        return client

    try:
        return cls(*args, kafka_client=network_client, **config)
    except BaseException:
        for client in started:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the constructor's error is the one to report
                pass
        raise
