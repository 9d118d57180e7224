"""User transforms for the end-to-end tests (imported by the Spark driver through PYTHONPATH)."""

from __future__ import annotations

import os


def fail_while_flagged(df):
    """A real job failure, on demand: raises while the file named by KBP_TEST_FAIL_FLAG exists."""
    flag = os.environ.get("KBP_TEST_FAIL_FLAG")
    if flag and os.path.exists(flag):
        raise RuntimeError(f"injected failure: {flag} exists")
    return df
