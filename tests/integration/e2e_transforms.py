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
    ids = {json.loads(r["value"])["id"] for r in df.select(df["value"].cast("string").alias("value")).collect()}
    hit = sorted(ids & poison)
    if hit:
        raise RuntimeError(f"injected failure: poison ids {hit[:5]} in the batch")
    return df
