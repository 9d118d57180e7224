"""The control modes: one interface (:class:`~.base.ControlMode`), one registry (:data:`REGISTRY`).

The controller, the settings' ``mode`` choices, the docs and the tests read :data:`REGISTRY`; nothing
else names a mode. Adding one is a module beside these (a :class:`~.base.ControlMode` subclass) and
a line here — or :func:`register` from outside the package (a plugin, a test).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

from .base import ControllerStateError, ControlMode, FinishedBatch, PlanDecision
from .cost import CostMode
from .spark import SparkMode

#: Every mode by name, in the order the docs list them.
REGISTRY: dict[str, type[ControlMode]] = {SparkMode.name: SparkMode, CostMode.name: CostMode}

SPARK = SparkMode.name
COST = CostMode.name


def register(mode: type[ControlMode]) -> type[ControlMode]:
    """Add ``mode`` to :data:`REGISTRY` under its ``name`` (usable as a class decorator)."""
    if not getattr(mode, "name", None):
        raise ValueError(f"{mode.__name__} has no name: set the class attribute 'name'")
    REGISTRY[mode.name] = mode
    return mode


__all__ = [
    "COST",
    "REGISTRY",
    "SPARK",
    "ControlMode",
    "ControllerStateError",
    "CostMode",
    "FinishedBatch",
    "PlanDecision",
    "SparkMode",
    "register",
]
