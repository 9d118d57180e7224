"""Seams where a test can hold a batch at a step no fault from outside reaches. Inert in the product.

Two seams, each a step of milliseconds that no outside fault (a SIGKILL timed from the sink's files
or the ledger's rows, a frozen broker, a stopped database) lands in reliably:

* :func:`after_commit` — between the sink commit and the ledger's mark (the batch operator): a batch
  whose output was swapped into the sink but not yet marked finished;
* :func:`after_plan` — between recording a plan and the end of the plan task: a batch planned that no
  ingest task will claim.

Nothing in the product registers a hook, reads the environment or sleeps here. The fault suite
registers its pause from ``tests/faults/inject/sitecustomize.py``, which only the processes it starts
load (through their ``PYTHONPATH``): arming the seam in a deployed Airflow needs code on its workers'
path, not an environment variable.
"""

from __future__ import annotations

from collections.abc import Callable

_AFTER_COMMIT: list[Callable[[str, int], None]] = []
_AFTER_PLAN: list[Callable[[str, int], None]] = []


def on_after_commit(hook: Callable[[str, int], None]) -> None:
    """Register ``hook(pipeline, batch_id)`` for :func:`after_commit` (tests only)."""
    _AFTER_COMMIT.append(hook)


def on_after_plan(hook: Callable[[str, int], None]) -> None:
    """Register ``hook(pipeline, batch_id)`` for :func:`after_plan` (tests only)."""
    _AFTER_PLAN.append(hook)


def after_commit(pipeline: str, batch_id: int) -> None:
    """The seam between the sink commit and the ledger's mark: runs the registered hooks (none in
    the product)."""
    for hook in list(_AFTER_COMMIT):
        hook(pipeline, batch_id)


def after_plan(pipeline: str, batch_id: int) -> None:
    """The seam between recording a plan and the end of the plan task: runs the registered hooks
    (none in the product)."""
    for hook in list(_AFTER_PLAN):
        hook(pipeline, batch_id)
