"""Which executors ran a Spark job, from the driver's own status store (classic sessions).

The Python reader names the executor that read each range in its completion records; Spark's own
Kafka reader leaves no such trace. :func:`executors_that_ran` runs an action under a job group of
its own and then reads, from the driver's ``AppStatusStore``, the executor id of every successful
task of the group's jobs. The store is fed by the listener bus, a moment behind the job's end: the
stages are read once their completed-task count has caught up (bounded wait). Over Spark Connect
the client has no driver to ask: None.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

#: How long to wait for the listener bus to report every task of the group's stages.
SETTLE_S = 10.0


def executors_that_ran(spark: Any, action: Callable[[], Any]) -> set[str] | None:
    """Run ``action`` (a Spark action on ``spark``) and return the ids of the executors whose tasks
    completed it; None over Spark Connect, or when the status store could not say."""
    sc = getattr(spark, "_sc", None) if getattr(spark, "_jvm", None) is not None else None
    if sc is None:
        action()
        return None
    group = f"kbp-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "kbp batch write", interruptOnCancel=True)
    try:
        action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        sc.setLocalProperty("spark.job.interruptOnCancel", None)
    try:
        return _group_executors(sc, group)
    except Exception:  # noqa: BLE001 - an internal API: a count is not worth failing a written batch
        return None


def _group_executors(sc: Any, group: str) -> set[str] | None:
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    stages = [s for job in tracker.getJobIdsForGroup(group) for s in (tracker.getJobInfo(job).stageIds or ())]
    deadline = time.monotonic() + SETTLE_S
    executors: set[str] = set()
    for stage_id in stages:
        while True:
            info = tracker.getStageInfo(stage_id)
            if info is not None and info.numCompletedTasks >= info.numTasks:
                break
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        tasks = store.taskList(stage_id, info.currentAttemptId, 1_000_000)
        for i in range(tasks.size()):
            task = tasks.apply(i)
            if task.status() == "SUCCESS":
                executors.add(str(task.executorId()))
    return executors
