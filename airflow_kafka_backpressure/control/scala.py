"""Scala/JVM numeric behaviour the control math must reproduce exactly."""

from __future__ import annotations

import math


def scala_round(x: float) -> int:
    """``scala.math.round(x: Double)``, i.e. ``java.lang.Math.round``: halves round up (towards +inf).

    Python's ``round`` rounds halves to even (``round(2.5) == 2``; Scala gives 3). Written without
    ``floor(x + 0.5)``, which is wrong for 0.49999999999999994.
    """
    if math.isnan(x):
        return 0
    f = math.floor(x)
    return int(f) + (1 if x - f >= 0.5 else 0)


def to_long(x: float) -> int:
    """``Double.toLong``: truncation towards zero (NaN → 0)."""
    if math.isnan(x):
        return 0
    return int(x)
