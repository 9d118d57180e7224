"""Loaded at start-up by every Python process the fault suite starts (first on their PYTHONPATH):
registers the suite's pause on the product's seam when the suite set its directory. See
:mod:`tests.faults.pause_point`."""

import os

if os.environ.get("KBP_TEST_PAUSE_AFTER_COMMIT_DIR"):
    from tests.faults.pause_point import install

    install()
