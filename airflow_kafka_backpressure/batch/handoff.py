"""The submit engine's hand-off between the Airflow worker and the Spark driver: one directory per
attempt under the sink, ``<sink>/_kbp/jobs/<attempt>/``, reachable from both sides whatever the deploy
mode (client, or cluster on YARN/Kubernetes where the driver runs on another machine).

* ``spec.json`` — the :class:`~.models.JobSpec`, written by the worker. Its Kafka client properties
  (credentials, possibly) are **sealed**: XORed with a one-time random key of the same length that
  never touches a shared filesystem or a command line — the driver finds it in the environment
  variable :data:`SPEC_KEY_ENV` (:func:`~.engines.submit.key_route`). The driver deletes the file as soon as it has read it, so even the sealed
  copy lives only until the job has started.
* ``metrics.json`` — the driver's :class:`~.models.BatchMetrics` when the batch committed, or
* ``error.json`` — ``{"error": message}`` when it failed with a known cause.

The worker deletes the directory when the job has ended, whatever happened.

Pure: :mod:`.storage` and the standard library.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from airflow_kafka_backpressure.batch.models import BatchMetrics, JobSpec
from airflow_kafka_backpressure.storage import Location, StorageError, location

JOBS_DIR = "_kbp/jobs"
SPEC_NAME = "spec.json"
METRICS_NAME = "metrics.json"
ERROR_NAME = "error.json"
#: Environment variable that carries the key of the sealed Kafka properties to the driver.
#: Its name holds "SECRET", so Spark's redaction pattern hides it where it shows a setting
#: (``spark.yarn.appMasterEnv.KBP_SPEC_SECRET`` in YARN cluster mode: its UI, its event log).
SPEC_KEY_ENV = "KBP_SPEC_SECRET"
#: Environment variable that carries the PID of the process that ran ``spark-submit`` (client mode):
#: the driver ends its application when that process is gone (:mod:`.spark.launcher_watch`).
LAUNCHER_PID_ENV = "KBP_LAUNCHER_PID"
#: Environment variable that carries the attempt's local scratch directory (client mode): a driver
#: whose launcher died removes it, with the hand-off directory, once its JVM is gone.
SCRATCH_DIR_ENV = "KBP_SCRATCH_DIR"


class HandoffError(RuntimeError):
    pass


def job_dir(sink: str, name: str) -> Location:
    """The hand-off directory of one attempt (``name`` must be unique per attempt)."""
    return location(sink).child(*JOBS_DIR.split("/"), name)


def seal(value: Any) -> tuple[str, str]:
    """``(sealed, key)``: the JSON of ``value`` XORed with a fresh random key of the same length."""
    plain = json.dumps(value, sort_keys=True).encode()
    key = os.urandom(len(plain))
    sealed = bytes(a ^ b for a, b in zip(plain, key))
    return base64.b64encode(sealed).decode(), base64.b64encode(key).decode()


def unseal(sealed: str, key: str) -> Any:
    data, pad = base64.b64decode(sealed), base64.b64decode(key)
    if len(data) != len(pad):
        raise HandoffError(
            "the key does not fit the sealed properties (was the spec written for another attempt?)"
        )
    return json.loads(bytes(a ^ b for a, b in zip(data, pad)).decode())


def write_spec(directory: Location, spec: JobSpec) -> tuple[str, str]:
    """Write ``spec`` with its Kafka properties sealed; returns ``(spec URI, key)``."""
    d = spec.to_dict()
    d["kafka"], key = seal(d["kafka"])
    d["kafka_sealed"] = True
    target = directory.child(SPEC_NAME)
    target.write_bytes(json.dumps(d).encode(), private=True)
    return target.uri, key


def take_spec(uri: str, key: str | None) -> JobSpec:
    """Read the spec at ``uri``, unseal it with ``key`` and delete the file (driver side)."""
    target = location(uri)
    try:
        d = json.loads(target.read_bytes())
    except StorageError as e:
        raise HandoffError(f"cannot read the job spec: {e}") from e
    except ValueError as e:
        raise HandoffError(f"the job spec at {uri} is not JSON: {e}") from e
    try:
        target.delete()
    except StorageError:
        pass  # the worker deletes the whole directory at the end anyway
    if d.pop("kafka_sealed", False):
        if not key:
            raise HandoffError(
                f"the job spec's Kafka properties are sealed but {SPEC_KEY_ENV} is not set in the driver's "
                "environment (YARN cluster mode: spark.yarn.appMasterEnv)"
            )
        d["kafka"] = unseal(d["kafka"], key)
    try:
        return JobSpec.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise HandoffError(f"the job spec at {uri} is not a valid JobSpec: {type(e).__name__}: {e}") from e


def write_metrics(directory: Location, metrics: BatchMetrics) -> None:
    directory.child(METRICS_NAME).write_bytes(json.dumps(metrics.to_dict(), sort_keys=True).encode())


def write_error(directory: Location, message: str) -> None:
    directory.child(ERROR_NAME).write_bytes(json.dumps({"error": message}).encode())


def read_result(directory: Location) -> BatchMetrics | str | None:
    """The driver's metrics, or its error message, or None when it left neither."""
    metrics = directory.child(METRICS_NAME)
    if metrics.exists():
        return BatchMetrics.from_dict(json.loads(metrics.read_bytes()))
    error = directory.child(ERROR_NAME)
    if error.exists():
        return str(json.loads(error.read_bytes()).get("error", "unknown error"))
    return None
