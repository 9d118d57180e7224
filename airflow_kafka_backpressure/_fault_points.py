"""Test-only fault points for the fault suite (``tests/faults``). Inert in production.

A pause point does something only when ``$KBP_TEST_PAUSE_AFTER_COMMIT_DIR`` is set **and** the test
armed it by creating ``<dir>/<pipeline>.arm``: the first batch of that pipeline to reach the point
takes the arm file (an atomic rename, so it fires once), writes its task process's PID to
``<dir>/<pipeline>.paused`` and sleeps, so the test can SIGKILL the task at a known step — after the
batch's output was swapped into the sink, before the ledger marked it finished.

Retention emulation: the embedded broker cannot delete records, so when
``$KBP_TEST_EARLIEST_OFFSETS_FILE`` names a JSON file ``{"<topic>": {"<partition>": offset}}`` the
offsets hook reports the earliest offsets raised to those (what a broker reports after retention
deleted the records below them). Only the hook sees it: a Spark job could still read the records.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .models import TopicPartition

PAUSE_AFTER_COMMIT_DIR_ENV = "KBP_TEST_PAUSE_AFTER_COMMIT_DIR"
PAUSE_S = 600.0
EARLIEST_OFFSETS_FILE_ENV = "KBP_TEST_EARLIEST_OFFSETS_FILE"


def after_commit(pipeline: str, batch_id: int) -> None:
    """Pause point between the sink commit and the ledger's mark (see the module doc)."""
    directory = os.environ.get(PAUSE_AFTER_COMMIT_DIR_ENV)
    if not directory:
        return
    d = Path(directory)
    try:
        os.rename(d / f"{pipeline}.arm", d / f"{pipeline}.fired")
    except FileNotFoundError:
        return
    tmp = d / f"{pipeline}.paused.tmp"
    tmp.write_text(f"{os.getpid()} {batch_id}")
    os.replace(tmp, d / f"{pipeline}.paused")
    time.sleep(PAUSE_S)


def emulated_earliest(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """``offsets`` (topic-partition → earliest offset) raised by the retention emulation, if any
    (see the module doc)."""
    path = os.environ.get(EARLIEST_OFFSETS_FILE_ENV)
    if not path:
        return dict(offsets)
    try:
        floors: dict[str, Any] = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return dict(offsets)
    out = {}
    for tp, offset in offsets.items():
        floor = floors.get(tp.topic, {}).get(str(tp.partition))
        out[tp] = offset if floor is None else max(int(offset), int(floor))
    return out
