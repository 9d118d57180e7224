"""The cost mode's correction: a PID on the backlog the feedforward's budget leaves behind.

Its error signal, once per finished batch (:func:`correction_error`), is the work the budget left
behind as a share of the interval; its output (:meth:`Correction.terms`) is a share of the interval
the cost mode adds to its drain cap (see :mod:`.cost_mode`'s doc for why and within which bounds).

Pure: no Airflow, Spark or Kafka import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from .cost import CostFit, CostModelError


class CostParams(Protocol):
    """What the correction reads of the cost mode's parameters (:class:`.cost_mode.CostParams`)."""

    @property
    def proportional(self) -> float: ...

    @property
    def integral(self) -> float: ...

    @property
    def derivative(self) -> float: ...

    @property
    def max_ratio(self) -> float: ...


@dataclass
class Correction:
    """The correction's state: the last two errors and the integral (shares of the interval)."""

    error: float | None = None
    previous_error: float | None = None
    integral: float = 0.0

    def terms(self, params: CostParams) -> dict[str, float]:
        """Each term of the next plan's correction and their sum, before the clamp (shares of the
        interval added to the drain cap)."""
        e = self.error or 0.0
        p = params.proportional * e
        i = params.integral * self.integral
        d = (
            0.0
            if self.error is None or self.previous_error is None
            else params.derivative * (self.error - self.previous_error)
        )
        return {"error": e, "proportional": p, "integral": i, "derivative": d, "output": p + i + d}

    def update(self, error: float, params: CostParams) -> None:
        """One finished batch's error (see the module's doc); the integral is kept in
        ``[0, max_ratio / integral]`` so it never asks for more than a whole interval."""
        self.previous_error, self.error = self.error, error
        limit = params.max_ratio / params.integral if params.integral > 0 else 0.0
        self.integral = min(max(self.integral + error, 0.0), limit)

    def reset(self) -> None:
        self.error, self.previous_error, self.integral = None, None, 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error, "previous_error": self.previous_error, "integral": self.integral}

    @classmethod
    def from_dict(cls, d: Any, where: str = "cost.correction") -> Correction:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise CostModelError(f"{where}: expected an object, got {type(d).__name__}")
        out = []
        for key in ("error", "previous_error", "integral"):
            v = d.get(key, 0.0 if key == "integral" else None)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            ):
                raise CostModelError(f"{where}.{key} = {v!r} must be a finite number or null")
            out.append(None if v is None else float(v))
        if out[2] is None or out[2] < 0:
            raise CostModelError(f"{where}.integral = {out[2]!r} must be a number >= 0")
        return cls(out[0], out[1], out[2])


def correction_error(
    fit: CostFit | None, available: int, budget: float | None, executors: int, interval_s: float
) -> float | None:
    """The correction's error for one finished batch: the work its budget left behind (records
    available at plan − budget, times the per-record cost per executor) as a share of the interval;
    negative when the budget left room. None without a model or a budget."""
    if fit is None or budget is None or not math.isfinite(budget) or interval_s <= 0:
        return None
    return (available - budget) * fit.per_record_s / max(executors, 1) / interval_s
