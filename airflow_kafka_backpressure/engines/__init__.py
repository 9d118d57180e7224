"""Batch engines: the two ways to run one batch's Spark job from the Airflow worker.

* ``submit`` (:mod:`.submit`) — a new application per batch through the Spark provider's
  ``SparkSubmitHook`` (client or cluster deploy mode); the spec and the result travel through a
  hand-off directory under the sink (:mod:`airflow_kafka_backpressure.batch.handoff`).
* ``connect`` (:mod:`.connect`) — a Spark Connect client session to a long-lived server; the job's
  code reaches the server through the session's artifacts.

Both run the same batch logic (:func:`airflow_kafka_backpressure.spark.job.run_batch`). This
package holds the launch side only and imports no Airflow at import time. :data:`REGISTRY` is the
one list of engines: pipeline validation, the hook and the docs read it. Each entry names the
engine module's ``from_hook(hook, executors)``, which builds an attempt's engine from
:class:`~..hooks.spark_batch.SparkBatchHook` (its connections and job settings): adding an engine
is one module and one line here. :func:`supervise` bounds a run in time and stops it on a kill, a
timeout or the death of the task's supervisor.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_kafka_backpressure.batch.models import BatchMetrics, JobSpec

log = logging.getLogger(__name__)

#: engine name -> (``module:function`` building it from the hook and the executor target, what it is)
REGISTRY: dict[str, tuple[str, str]] = {
    "submit": (
        "airflow_kafka_backpressure.engines.submit:from_hook",
        "a spark-submit per batch (the Spark provider)",
    ),
    "connect": (
        "airflow_kafka_backpressure.engines.connect:from_hook",
        "a session on a long-lived Spark Connect server",
    ),
}
ENGINES = tuple(REGISTRY)
#: How long a stopped run may take to wind down before the wait gives up on it.
STOP_GRACE_S = 120.0


def _entry(name: str) -> tuple[Any, str]:
    """Engine ``name``'s module (imported now) and the name of its factory, from :data:`REGISTRY`."""
    if name not in REGISTRY:
        raise ValueError(f"engine = {name!r} is invalid: use one of {', '.join(ENGINES)}")
    module, _, function = REGISTRY[name][0].partition(":")
    return importlib.import_module(module), function


def engine_for(name: str, hook: Any, executors: int) -> Engine:
    """A new attempt's engine ``name`` (see :data:`REGISTRY`)."""
    module, factory = _entry(name)
    return getattr(module, factory)(hook, executors)


def spark_master(name: str, hook: Any) -> str | None:
    """The Spark master engine ``name``'s batches run on, as far as the Airflow side can know it: the
    engine module's ``spark_master(hook)``, or None for an engine without one (a Spark Connect
    server's master is the server's own)."""
    master_of = getattr(_entry(name)[0], "spark_master", None)
    return None if master_of is None else master_of(hook)


class BatchJobError(RuntimeError):
    """The batch's job failed; ``job_message`` is what happened, for the ledger and the task log."""

    def __init__(self, batch_id: int, message: str):
        self.batch_id = batch_id
        self.job_message = message
        super().__init__(f"Batch {batch_id} failed: {message}")


class BatchStopped(BatchJobError):
    """The batch was stopped on purpose (timeout, task killed, supervisor gone)."""


class Engine:
    """One attempt at one batch. ``run`` blocks until the job ends; ``stop`` (from another thread)
    ends it early and makes ``run`` raise :class:`BatchStopped`."""

    name = "engine"

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self._stop_lock = threading.Lock()

    def run(self, spec: JobSpec) -> BatchMetrics:  # pragma: no cover - interface
        raise NotImplementedError

    def stop(self, reason: str) -> None:
        """Stop the run (once; later calls do nothing)."""
        with self._stop_lock:
            if self.stop_reason is not None:
                return
            self.stop_reason = reason
        log.warning("Stopping the batch's Spark work: %s", reason)
        self._stop()

    def restop(self) -> None:
        """Stop again whatever may have started since :meth:`stop` (idempotent)."""
        if self.stop_reason is not None:
            self._stop()

    def _stop(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def stopped_error(self, spec: JobSpec) -> BatchStopped | None:
        if self.stop_reason is None:
            return None
        return BatchStopped(
            spec.plan.batch_id, f"{self.stop_reason}; {self.name} engine stopped the batch's Spark work"
        )


def thread_stack(thread: threading.Thread) -> str:
    """Where ``thread`` is now (for a log line saying what a stuck run waits for)."""
    import traceback

    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(the thread has ended)"


def supervise(
    engine: Engine,
    spec: JobSpec,
    *,
    timeout_s: float,
    poll_s: float = 0.5,
    parent_pid: int | None = None,
    on_start: Callable[[], Any] | None = None,
    heartbeat: Callable[[], Any] | None = None,
    heartbeat_s: float = 30.0,
) -> BatchMetrics:
    """Run ``engine.run(spec)`` in a thread and wait for it in this one, stopping it when

    * it runs longer than ``timeout_s`` (``BatchStopped``: "... timed out after N s");
    * this process's parent changes (the Airflow task supervisor died: nobody would collect the
      result, so the Spark work is stopped instead of running on unattended);
    * this thread is interrupted (a signal handler raising, Airflow's execution timeout): the
      engine is stopped and the exception re-raised;
    * ``heartbeat`` (called every ``heartbeat_s`` while the run lasts: the ledger lease) raises —
      e.g. another attempt took the batch over.

    The wait runs in the calling (main) thread so that Airflow's signal handlers — ``on_kill`` — run
    at once; ``on_kill`` calls ``engine.stop`` and the run ends with ``BatchStopped``.
    """
    result: dict[str, Any] = {}
    parent = os.getppid() if parent_pid is None else parent_pid

    def target() -> None:
        try:
            result["metrics"] = engine.run(spec)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            result["error"] = e

    worker = threading.Thread(target=target, name=f"kbp-batch-{spec.plan.batch_id}", daemon=True)
    started = time.monotonic()
    worker.start()
    stopping_since: float | None = None
    last_beat = started
    try:
        if on_start is not None:
            on_start()
        while worker.is_alive():
            worker.join(poll_s)
            if not worker.is_alive():
                break
            now = time.monotonic()
            if engine.stop_reason is not None:  # stopped here or by on_kill: let it wind down
                stopping_since = stopping_since or now
                if int(now - stopping_since) % 5 == 0:
                    engine.restop()  # work that started after the first stop is stopped too
                if now - stopping_since > STOP_GRACE_S:
                    log.error(
                        "The batch's Spark work did not end %s s after it was stopped; giving up on it. "
                        "It is stuck in:\n%s",
                        STOP_GRACE_S,
                        thread_stack(worker),
                    )
                    break
            elif now - started > timeout_s:
                engine.stop(
                    f"timed out after {timeout_s:g} s (the batch timeout; raise batch_timeout_s if batches "
                    "legitimately take longer)"
                )
            elif os.getppid() != parent:
                engine.stop("the Airflow task supervisor that started the batch is gone")
            elif heartbeat is not None and now - last_beat >= heartbeat_s:
                last_beat = now
                try:
                    heartbeat()
                except Exception as e:  # noqa: BLE001 - whatever it is, this attempt must not go on
                    engine.stop(f"the batch's lease could not be renewed ({type(e).__name__}: {e})")
    except BaseException as e:
        engine.stop(f"interrupted in the Airflow worker ({type(e).__name__})")
        worker.join(STOP_GRACE_S)
        raise
    stopped = engine.stopped_error(spec)
    if stopped is not None:
        raise stopped
    if "error" in result:
        raise result["error"]
    return result["metrics"]
