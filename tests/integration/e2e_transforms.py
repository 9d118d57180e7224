"""User transforms for the end-to-end tests (imported by the Spark driver through PYTHONPATH)."""

from __future__ import annotations

import os


def fail_while_flagged(df):
    """A real job failure, on demand: raises while the file named by KBP_TEST_FAIL_FLAG exists."""
    flag = os.environ.get("KBP_TEST_FAIL_FLAG")
    if flag and os.path.exists(flag):
        raise RuntimeError(f"injected failure: {flag} exists")
    return df


#: Work per record of :func:`cost_per_record`, seconds (a sleep: it costs the same on a loaded machine).
SECONDS_PER_RECORD = 0.02


def _sleep_per_record(batches):
    import time

    for batch in batches:
        time.sleep(batch.num_rows * SECONDS_PER_RECORD)
        yield batch


def cost_per_record(df):
    """The records unchanged, after ``SECONDS_PER_RECORD`` of work each (in the Python worker that
    holds them): a per-record cost that is known and does not depend on the machine's load."""
    return df.mapInArrow(_sleep_per_record, df.schema)
