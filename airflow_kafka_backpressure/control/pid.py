"""Spark Streaming's PID rate estimator, with state you can store, inspect and restore.

Behaves exactly as ``org.apache.spark.streaming.scheduler.rate.PIDRateEstimator``: the rate is
in records per second, the error is the difference between the rate asked for last time and the
rate the last batch was actually processed at, the integral term comes from the scheduling delay,
and the estimate never drops below ``min_rate``.

:class:`RateController` adds what Spark's ``RateController`` does around it: it keeps the last
published rate limit, truncated to a whole number of records per second (``-1`` until the first
estimate), which is what the planner uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .scala import to_long


def _check(name: str, value: float, ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(f"PIDRateEstimator: {name} = {value!r} is invalid: it must be {rule}")


class PIDRateEstimator:
    """A proportional-integral-derivative controller of the ingestion rate.

    :param batch_interval_ms: the batch interval (the DAG's schedule), > 0.
    :param proportional: weight of the current error, >= 0 (Spark's default 1.0).
    :param integral: weight of the accumulated error (from scheduling delay), >= 0 (default 0.2).
    :param derivative: weight of the error's rate of change, >= 0 (default 0.0).
    :param min_rate: the lowest rate ever estimated, > 0 (records/s, default 100).
    """

    def __init__(
        self,
        batch_interval_ms: int,
        proportional: float = 1.0,
        integral: float = 0.2,
        derivative: float = 0.0,
        min_rate: float = 100.0,
    ) -> None:
        _check("batch_interval_ms", batch_interval_ms, batch_interval_ms > 0, "> 0")
        _check("proportional", proportional, proportional >= 0, ">= 0")
        _check("integral", integral, integral >= 0, ">= 0")
        _check("derivative", derivative, derivative >= 0, ">= 0")
        _check("min_rate", min_rate, min_rate > 0, "> 0")
        self.batch_interval_ms = int(batch_interval_ms)
        self.proportional = float(proportional)
        self.integral = float(integral)
        self.derivative = float(derivative)
        self.min_rate = float(min_rate)
        self.reset()

    def reset(self) -> None:
        """Forget all history: the next ``compute`` seeds the estimator again."""
        self.first_run = True
        self.latest_time = -1
        self.latest_rate = -1.0
        self.latest_error = -1.0

    def compute(
        self, time_ms: int, num_elements: int, processing_delay_ms: int, scheduling_delay_ms: int
    ) -> float | None:
        """Feed one completed batch; return the new rate (records/s), or None.

        None on the first batch (it only seeds the estimator), and whenever the batch tells nothing:
        time did not advance, no records, or no processing delay.
        """
        if not (time_ms > self.latest_time and num_elements > 0 and processing_delay_ms > 0):
            return None

        # seconds since the last update; close to the batch interval
        delay_since_update = (time_ms - self.latest_time) / 1000
        # records per second the last batch was actually processed at
        processing_rate = num_elements / processing_delay_ms * 1000
        # proportional: the rate asked for last time minus the rate achieved
        error = self.latest_rate - processing_rate
        # integral: a scheduling delay of s means s * processing_rate records overflowed earlier
        # batches; spread over one batch interval, that is the historical error (records/s)
        historical_error = scheduling_delay_ms * processing_rate / self.batch_interval_ms
        # derivative: change of the error per second
        d_error = (error - self.latest_error) / delay_since_update

        new_rate = max(
            self.latest_rate
            - self.proportional * error
            - self.integral * historical_error
            - self.derivative * d_error,
            self.min_rate,
        )

        self.latest_time = time_ms
        if self.first_run:
            self.latest_rate = processing_rate
            self.latest_error = 0.0
            self.first_run = False
            return None
        self.latest_rate = new_rate
        self.latest_error = error
        return new_rate

    # ----- state -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "first_run": self.first_run,
            "latest_time": self.latest_time,
            "latest_rate": self.latest_rate,
            "latest_error": self.latest_error,
        }

    def load_state(self, state: dict[str, Any]) -> PIDRateEstimator:
        self.first_run = bool(state["first_run"])
        self.latest_time = int(state["latest_time"])
        self.latest_rate = float(state["latest_rate"])
        self.latest_error = float(state["latest_error"])
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_interval_ms": self.batch_interval_ms,
            "proportional": self.proportional,
            "integral": self.integral,
            "derivative": self.derivative,
            "min_rate": self.min_rate,
            "state": self.state(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PIDRateEstimator:
        est = cls(d["batch_interval_ms"], d["proportional"], d["integral"], d["derivative"], d["min_rate"])
        return est.load_state(d["state"])

    def __repr__(self) -> str:
        return (
            f"PIDRateEstimator(batch_interval_ms={self.batch_interval_ms}, proportional="
            f"{self.proportional}, integral={self.integral}, derivative={self.derivative}, "
            f"min_rate={self.min_rate}, state={self.state()})"
        )


@dataclass
class RateController:
    """The estimator plus the last published rate limit (Spark's ``RateController``).

    It also remembers the last batch that moved the estimator (its inputs and the state before
    it), so that new gains edited between two batches take effect at once: :meth:`retuned`
    re-applies that batch under the new gains instead of waiting one more batch.
    """

    estimator: PIDRateEstimator
    rate_limit: int = -1
    last_batch: dict[str, Any] | None = None

    def on_batch_completed(
        self, time_ms: int, num_elements: int, processing_delay_ms: int, scheduling_delay_ms: int
    ) -> float | None:
        before = self.estimator.state()
        rate_limit_before = self.rate_limit
        new_rate = self.estimator.compute(time_ms, num_elements, processing_delay_ms, scheduling_delay_ms)
        if new_rate is not None:
            self.rate_limit = to_long(new_rate)
        if self.estimator.state() != before:
            self.last_batch = {
                "time_ms": int(time_ms),
                "num_elements": int(num_elements),
                "processing_delay_ms": int(processing_delay_ms),
                "scheduling_delay_ms": int(scheduling_delay_ms),
                "state_before": before,
                "rate_limit_before": rate_limit_before,
            }
        return new_rate

    @property
    def latest_rate(self) -> int:
        """The rate limit the planner uses: records/s, or -1 before the first estimate."""
        return self.rate_limit

    def params(self) -> dict[str, Any]:
        d = self.estimator.to_dict()
        d.pop("state")
        return d

    def retuned(self, estimator: PIDRateEstimator) -> RateController:
        """This controller under ``estimator``'s parameters (gains, min rate, interval).

        Unchanged parameters return ``self``. Otherwise the last batch is replayed from the state
        before it with the new parameters, as if they had been in force then.
        """
        fresh = estimator.to_dict()
        fresh.pop("state")
        if fresh == self.params():
            return self
        new_est = PIDRateEstimator.from_dict({**fresh, "state": self.estimator.state()})
        if self.last_batch is None:
            return RateController(new_est, self.rate_limit, None)
        lb = self.last_batch
        new_est.load_state(lb["state_before"])
        controller = RateController(new_est, int(lb["rate_limit_before"]), None)
        controller.on_batch_completed(
            lb["time_ms"], lb["num_elements"], lb["processing_delay_ms"], lb["scheduling_delay_ms"]
        )
        return controller

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator.to_dict(),
            "rate_limit": self.rate_limit,
            "last_batch": self.last_batch,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RateController:
        return cls(PIDRateEstimator.from_dict(d["estimator"]), int(d["rate_limit"]), d.get("last_batch"))
