"""User transforms for the end-to-end tests (imported by the Spark driver through PYTHONPATH)."""

from __future__ import annotations

import os


def fail_while_flagged(df):
    """A real job failure, on demand: raises while the file named by KBP_TEST_FAIL_FLAG exists."""
    flag = os.environ.get("KBP_TEST_FAIL_FLAG")
    if flag and os.path.exists(flag):
        raise RuntimeError(f"injected failure: {flag} exists")
    return df


def fail_on_poison(df):
    """A real job failure for chosen records: raises when the batch holds an id listed (JSON) in the
    file named by KBP_TEST_POISON_FILE."""
    import json

    path = os.environ.get("KBP_TEST_POISON_FILE")
    if not path or not os.path.exists(path):
        return df
    with open(path) as f:
        poison = set(json.load(f))
    ids = {
        json.loads(r["value"])["id"] for r in df.select(df["value"].cast("string").alias("value")).collect()
    }
    hit = sorted(ids & poison)
    if hit:
        raise RuntimeError(f"injected failure: poison ids {hit[:5]} in the batch")
    return df


def hold_while_flagged(df):
    """A batch that does not end on its own, on demand: while the file named by KBP_TEST_HOLD_FLAG
    exists, every row waits in a Python UDF (in a Spark Python worker: the driver's executors for the
    submit engine, the Connect server's for the connect engine) until the flag is removed or the task
    is killed. Each worker that starts waiting appends its PID to ``<flag>.pids``, so a test can
    check that stopping the batch killed it."""
    flag = os.environ.get("KBP_TEST_HOLD_FLAG")
    if not flag or not os.path.exists(flag):
        return df
    from pyspark.sql import functions as F

    pids = flag + ".pids"

    def hold(value):  # nested: pickled by value, the worker needs no test module
        import os as _os
        import time as _time

        with open(pids, "a") as f:
            f.write(f"{_os.getpid()}\n")
        deadline = _time.monotonic() + 900  # a safety net, far beyond any test's kill
        while _os.path.exists(flag) and _time.monotonic() < deadline:
            _time.sleep(0.2)
        return value

    return df.withColumn("value", F.udf(hold, df.schema["value"].dataType)(F.col("value")))


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
