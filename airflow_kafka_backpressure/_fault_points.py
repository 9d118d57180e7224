"""Test-only fault points for the fault suite (``tests/faults``). Inert in production.

A pause point does something only when ``$KBP_TEST_PAUSE_AFTER_COMMIT_DIR`` is set **and** the test
armed it by creating ``<dir>/<pipeline>.arm``: the first batch of that pipeline to reach the point
takes the arm file (an atomic rename, so it fires once), writes its task process's PID to
``<dir>/<pipeline>.paused`` and sleeps, so the test can SIGKILL the task at a known step — after the
batch's output was swapped into the sink, before the ledger marked it finished.

"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_AFTER_COMMIT_DIR_ENV = "KBP_TEST_PAUSE_AFTER_COMMIT_DIR"
PAUSE_S = 600.0


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
