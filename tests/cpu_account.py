"""Where the suite's CPU goes, test by test (opt-in: ``KBP_TEST_CPU_LOG=<file>``).

For each test (setup, call and teardown together) one tab-separated line is appended to the file:
the test's id, its wall seconds and the CPU seconds of this pytest process's whole tree over it —
this process, every live descendant (the shared broker, Connect server and Airflow processes, the
spark-submit drivers and the JVMs they start) and those reaped meanwhile (counted by the parent
that waited for them). A shared server's CPU goes to the test that kept it busy; a session
fixture's start to the first test that asks for it. Two shards running at once each log their own
tree, so the lines of both add up to the suite's CPU (but for processes that left the tree as
orphans: daemons are reparented to init, and their CPU is lost to this count).

Used to choose what to cut when `.ci/run` is over its time budget (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

_LOG = os.environ.get("KBP_TEST_CPU_LOG")


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and its descendants, including their reaped children."""
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue  # ended between the listing and the read: its parent counts it once reaped
        total += t.user + t.system + t.children_user + t.children_system
    return total


if _LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        if item.config.getoption("setupplan", False) or item.config.getoption("setuponly", False):
            yield  # nothing runs (.ci/checks.sh's --setup-plan): no line
            return
        wall, cpu = time.monotonic(), tree_cpu_seconds()
        yield
        line = f"{item.nodeid}\t{time.monotonic() - wall:.1f}\t{tree_cpu_seconds() - cpu:.1f}\n"
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(line)
