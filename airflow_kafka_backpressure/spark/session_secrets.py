"""Kafka credentials kept out of Spark Connect plans.

On the connect engine every step of a batch reaches the server as a plan: the server shows its text
in its UI (the Connect tab), writes it to its event log (and so to the History Server), and the plan
crosses the network. Spark redacts that text only by ``spark.sql.redaction.string.regex``, which has
no default. So on that engine no secret Kafka property (:data:`~..kafka.credentials.SECRET_PROPERTIES`
given as a value) goes into a plan:

* the engine writes them into a file of the batch's server session — a Spark Connect file artifact,
  :data:`SECRETS_FILE` — before the first plan (the file is sent by the artifact protocol, which the
  server neither shows nor logs, and lives in the session's own directory on the server and its
  executors until the session ends);
* the plans carry the Kafka properties without them and the file's name (:func:`plan_properties`);
* the Python code that makes Kafka clients on the executors (the Python reader, the arrow writer)
  adds them back from the session's files (:func:`with_session_secrets`).

Spark's own Kafka connector takes its credentials only from its options or from the Spark hosts
themselves: on the connect engine it reads a batch whose credentials are references to secrets on
the Spark hosts (``${dir:…}``, ``${env:…}``, :mod:`..kafka.credentials`), and ``reader="auto"``
picks the Python reader when they are values (:func:`.readers.choose_reader`).

On the submit engine the properties reach the driver in the sealed hand-off file and its plans never
leave the driver: :data:`~..models.JobSpec.secrets_file` is None there and nothing changes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.kafka.credentials import literal_secrets
from airflow_kafka_backpressure.spark.errors import JobError

__all__ = ["SECRETS_FILE", "plan_properties", "with_session_secrets", "write_secrets_file"]

#: The session file that holds a batch's secret Kafka properties (one per server session: the
#: connect engine keys its kept sessions by the file's content, so a changed password gets a new one).
SECRETS_FILE = "kbp-kafka-credentials.json"


def write_secrets_file(props: Mapping[str, Any], directory: Path) -> Path | None:
    """Write the secret properties of ``props`` given as values into ``directory``/:data:`SECRETS_FILE`
    (owner-only); None (nothing written) when there are none."""
    secrets = literal_secrets(props)
    if not secrets:
        return None
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / SECRETS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(secrets, f, sort_keys=True)
    return path


def plan_properties(props: Mapping[str, Any], secrets_file: str | None) -> dict[str, Any]:
    """The Kafka properties a plan may carry: without the secret values when they travel in the
    session's ``secrets_file``."""
    if secrets_file is None:
        return dict(props)
    secret = literal_secrets(props)
    return {k: v for k, v in props.items() if k not in secret}


def with_session_secrets(props: Mapping[str, Any], secrets_file: str | None) -> dict[str, Any]:
    """On an executor (or the server's Python worker): ``props`` with the secret properties of the
    session's ``secrets_file`` added back (``props`` as they are when None)."""
    if not secrets_file:
        return dict(props)
    from pyspark import SparkFiles

    path = os.path.join(SparkFiles.getRootDirectory(), secrets_file)
    try:
        with open(path, encoding="utf-8") as f:
            secrets = json.load(f)
    except (OSError, ValueError) as e:
        raise JobError(
            f"the batch's Kafka credentials were sent to the Spark Connect session as the file {secrets_file!r}, "
            f"but this executor cannot read it ({type(e).__name__}): the session's files did not reach it. "
            "Run the batch again; if it persists, check the Connect server's artifact settings"
        ) from e
    return {**props, **secrets}


def check_no_literal_secrets(props: Mapping[str, Any], secrets_file: str | None, what: str) -> None:
    """Raise :class:`JobError` when ``props`` would put a secret value into a Spark Connect plan."""
    if secrets_file is None:
        return
    secret = literal_secrets(props)
    if secret:
        raise JobError(
            f"{what} would carry {', '.join(sorted(secret))} in a Spark Connect plan, which the server shows "
            "in its UI and event log"
        )
