"""A trigger that polls a blocking check in a thread until it has an answer or reaches its deadline.

Subclasses implement :meth:`PollingTrigger.check` (run with ``asyncio.to_thread``: connections are
resolved there through the hooks, which works in the triggerer) and ``serialize()``. Events:
``{"status": "found", ...check's payload}``, ``{"status": "timeout"}`` at ``deadline_ms`` (epoch ms),
``{"status": "error", "message": ...}`` when the check raises (reported, not retried: the task fails
with the message and Airflow's retries apply). The trigger keeps its own deadline, so the wait ends
even where no scheduler enforces the deferral timeout (``dag.test()`` runs triggers inline).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class PollingTrigger(BaseTrigger):
    def __init__(self, poll_interval_s: float = 30.0, deadline_ms: int | None = None) -> None:
        super().__init__()
        self.poll_interval_s = poll_interval_s
        self.deadline_ms = deadline_ms

    def check(self) -> dict[str, Any] | None:
        """The payload of the ``found`` event, or None to wait another interval (blocking is fine)."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                found = await asyncio.to_thread(self.check)
            except Exception as e:  # report, do not spin: the task fails with the message
                yield TriggerEvent({"status": "error", "message": f"{type(e).__name__}: {e}"})
                return
            if found is not None:
                yield TriggerEvent({"status": "found", **found})
                return
            now_ms = time.time() * 1000
            if self.deadline_ms is not None and now_ms >= self.deadline_ms:
                yield TriggerEvent({"status": "timeout"})
                return
            wait_s = self.poll_interval_s
            if self.deadline_ms is not None:
                wait_s = min(wait_s, max((self.deadline_ms - now_ms) / 1000, 0.0))
            await asyncio.sleep(wait_s)
