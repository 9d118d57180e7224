"""Controller settings from an Airflow Variable: one JSON object per pipeline, validated.

Users edit the mode, gains and limits in the Airflow UI (Admin → Variables). Every key is optional;
a missing key takes its default (Spark's, for Spark's keys). An invalid edit raises
:class:`SettingsError` naming the Variable, the key, the bad value and the allowed range — and
nothing else happens, so no state changes. NaN and infinities are refused everywhere.

Pure Python: no Airflow import (the operators read the Variable and pass its text here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.control import cost_mode, cost_model, scaling
from airflow_kafka_backpressure.control.allocation import RateLimits
from airflow_kafka_backpressure.control.controller import DEFAULT_MODE, MODES
from airflow_kafka_backpressure.control.cost_mode import CostParams
from airflow_kafka_backpressure.control.pid import PIDRateEstimator
from airflow_kafka_backpressure.control.scaling import ScalingPolicy

#: The default cap of records per batch (any mode, any batch; Structured Streaming's
#: ``maxOffsetsPerTrigger``). Without it the first batch of a new pipeline starting at ``earliest``
#: would read a topic's whole retention in one job. A million records is 10-35 s of work for one
#: executor of the Python reader measured here (29-87k records/s), so a first batch fits a typical
#: interval, and it is far above what steady pipelines of this size read per batch.
DEFAULT_MAX_RECORDS_PER_BATCH = 1_000_000


#: Structured Streaming's default ``maxTriggerDelay`` (15 minutes).
DEFAULT_MAX_BATCH_DELAY_S = 900.0


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class _Rule:
    kind: type  # float, int, bool or str
    low: float | None = None
    low_open: bool = False  # low is exclusive
    high: float | None = None
    doc: str = ""
    choices: tuple[str, ...] = ()  # for str

    def describe(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.kind is str:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        bracket = "(" if self.low_open or self.low is None else "["
        what = "an integer" if self.kind is int else "a number"
        return f"{what} in {bracket}{lo}, {hi}{']' if self.high is not None else ')'}"


def _key(default: Any, kind: type, low: float | None = None, **rule: Any) -> Any:
    """One settings key, declared once: its default and its rule (type, range, doc), which
    validation (:func:`parse_settings`), the Variable's help text and the docs all read."""
    return field(default=default, metadata={"rule": _Rule(kind, low, **rule)})


# Each key once: the type, default, range and doc of every key of the settings Variable (Spark's
# keys default to Spark's values).
@dataclass(frozen=True)
class ControllerSettings:
    mode: str = _key(
        DEFAULT_MODE,
        str,
        choices=MODES,
        doc="'spark': Spark's PID, bit for bit; 'cost': batches sized from a fitted fixed + per-record cost model",
    )
    backpressure_enabled: bool = _key(
        True, bool, doc="size batches by the controller (spark.streaming.backpressure.enabled)"
    )
    proportional: float = _key(
        1.0,
        float,
        0.0,
        doc="PID proportional gain (spark: spark.streaming.backpressure.pid.proportional; cost: the correction's gain on the work the last budget left behind, as a share of the interval)",
    )
    integral: float = _key(
        0.2,
        float,
        0.0,
        doc="PID integral gain (spark: …pid.integral; cost: the gain on the sum of those errors, which removes a steady-state deficit)",
    )
    derivative: float = _key(
        0.0,
        float,
        0.0,
        doc="PID derivative gain (spark: …pid.derived; cost: the gain on the change of that error)",
    )
    min_rate: float = _key(
        100.0,
        float,
        1.0,
        doc="lowest estimated rate, records/s (…pid.minRate); below 1 the published limit would truncate to 0, which means 'unlimited'",
    )
    initial_rate: int = _key(
        0, int, 0, doc="records/s before the first estimate, 0 = none (…backpressure.initialRate)"
    )
    max_rate_per_partition: int = _key(
        0, int, 0, doc="records/s cap per partition, 0 = none (…kafka.maxRatePerPartition)"
    )
    min_rate_per_partition: int = _key(
        1, int, 1, doc="records per batch floor per partition (…kafka.minRatePerPartition)"
    )
    max_rate_per_topic: dict[str, int] = field(
        default_factory=dict, metadata={"map": 'per-topic max records/s per partition, e.g. {"orders": 500}'}
    )
    max_records_per_batch: int = _key(
        DEFAULT_MAX_RECORDS_PER_BATCH,
        int,
        1,
        doc="cap of records per batch, any mode, the first batches included (like maxOffsetsPerTrigger)",
    )
    min_records_per_batch: int = _key(
        0,
        int,
        0,
        doc="a run with fewer records available skips its batch (plans and commits nothing) until max_batch_delay_s has passed since the last batch; 0 = off (like minOffsetsPerTrigger)",
    )
    max_batch_delay_s: float = _key(
        DEFAULT_MAX_BATCH_DELAY_S,
        float,
        0.0,
        doc="seconds after the last batch's plan when a run plans whatever there is, below min_records_per_batch too (like maxTriggerDelay)",
    )
    min_batch_fixed_share: float = _key(
        0.0,
        float,
        0.0,
        high=1.0,
        doc="cost mode: also wait (as below min_records_per_batch) while the batch would spend more than this share of its predicted time on the fitted fixed cost, e.g. 0.5; 0 = off",
    )
    target_ratio: float = _key(
        cost_mode.DEFAULT_TARGET_RATIO,
        float,
        0.0,
        low_open=True,
        high=1.0,
        doc="cost mode: processing time / interval the batches aim at when keeping up",
    )
    max_ratio: float = _key(
        cost_mode.DEFAULT_MAX_RATIO,
        float,
        0.0,
        low_open=True,
        high=1.0,
        doc="cost mode: the most of the interval a batch may use while draining a backlog",
    )
    drain_horizon_s: float = _key(
        cost_mode.DEFAULT_DRAIN_HORIZON_S,
        float,
        0.0,
        doc="cost mode: clear a backlog within this many seconds with the smallest batches that do; 0 = as fast as max_ratio allows",
    )
    cost_window_batches: int = _key(
        cost_model.DEFAULT_WINDOW_BATCHES, int, 2, doc="cost mode: recent batches the cost model is fitted on"
    )
    scaling_enabled: bool = _key(True, bool, doc="let the scaling operator change the executor target")
    scaling_up_ratio: float = _key(
        scaling.SCALING_UP_RATIO, float, 0.0, low_open=True, doc="scale up at avg processing/interval >= this"
    )
    scaling_down_ratio: float = _key(
        scaling.SCALING_DOWN_RATIO,
        float,
        0.0,
        low_open=True,
        doc="scale down at avg processing/interval <= this",
    )
    min_executors: int = _key(scaling.MIN_EXECUTORS, int, 1, doc="lowest executor target")
    max_executors: int = _key(scaling.MAX_EXECUTORS, int, 1, doc="highest executor target")
    initial_executors: int = _key(
        scaling.INITIAL_EXECUTORS, int, 1, doc="executor target before any scaling decision"
    )
    scaling_window_batches: int = _key(
        scaling.SCALING_WINDOW_BATCHES, int, 1, doc="successful batches averaged per decision"
    )
    cooldown_batches: int = _key(
        scaling.COOLDOWN_BATCHES, int, 0, doc="batches after a change during which the target holds"
    )

    # ----- derived objects for the control core ---------------------------------------------
    def estimator(self, batch_interval_ms: int) -> PIDRateEstimator:
        return PIDRateEstimator(
            batch_interval_ms, self.proportional, self.integral, self.derivative, self.min_rate
        )

    def rate_limits(self, partitions: Sequence[TopicPartition] | None = None) -> RateLimits:
        overrides = {
            tp: int(self.max_rate_per_topic[tp.topic])
            for tp in (partitions or [])
            if tp.topic in self.max_rate_per_topic
        }
        return RateLimits(
            max_rate_per_partition=self.max_rate_per_partition,
            min_rate_per_partition=self.min_rate_per_partition,
            initial_rate=self.initial_rate,
            max_rate_overrides=overrides,
            max_records_per_batch=self.max_records_per_batch,
        )

    def cost_params(self) -> CostParams:
        return CostParams(
            self.target_ratio,
            self.max_ratio,
            self.drain_horizon_s,
            self.cost_window_batches,
            self.proportional,
            self.integral,
            self.derivative,
        )

    def scaling_policy(self) -> ScalingPolicy:
        return ScalingPolicy(
            scaling_up_ratio=self.scaling_up_ratio,
            scaling_down_ratio=self.scaling_down_ratio,
            min_executors=self.min_executors,
            max_executors=self.max_executors,
            cooldown_batches=self.cooldown_batches,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


#: key -> rule, from the declarations above.
RULES: dict[str, _Rule] = {
    f.name: f.metadata["rule"] for f in fields(ControllerSettings) if "rule" in f.metadata
}
#: per-topic caps: {"topic": records/s}
MAP_KEYS = {f.name for f in fields(ControllerSettings) if "map" in f.metadata}


def _coerce(source: str, key: str, value: Any, rule: _Rule) -> Any:
    def fail(problem: str) -> SettingsError:
        return SettingsError(
            f"{source}: key {key!r} = {value!r} is invalid: {problem}; allowed: {rule.describe()}"
            + (f" ({rule.doc})" if rule.doc else "")
        )

    if rule.kind is bool:
        if isinstance(value, bool):
            return value
        raise fail("not a boolean")
    if rule.kind is str:
        if isinstance(value, str) and value in rule.choices:
            return value
        raise fail("not an allowed value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail("not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise fail("not a finite number")
    if rule.kind is int:
        if isinstance(value, float):
            if not value.is_integer():
                raise fail("not a whole number")
            value = int(value)
    else:
        value = float(value)
    if rule.low is not None and (value <= rule.low if rule.low_open else value < rule.low):
        raise fail("out of range")
    if rule.high is not None and value > rule.high:
        raise fail("out of range")
    return value


def parse_settings(
    text: str | dict[str, Any] | None, *, source: str = "controller settings"
) -> ControllerSettings:
    """Validate a JSON object of settings; ``source`` (e.g. the Variable key) appears in errors."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raw: dict[str, Any] = {}
    elif isinstance(text, dict):
        raw = text
    else:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise SettingsError(
                f"{source}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); expected an "
                'object such as {"proportional": 1.0, "integral": 0.2}'
            ) from e
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: expected a JSON object of settings, got {type(raw).__name__}")

    known = set(RULES) | MAP_KEYS
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SettingsError(f"{source}: unknown key(s) {unknown}; allowed keys: {sorted(known)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in RULES:
            values[key] = _coerce(source, key, value, RULES[key])
    if "max_rate_per_topic" in raw:
        caps = raw["max_rate_per_topic"]
        if not isinstance(caps, dict):
            raise SettingsError(
                f"{source}: key 'max_rate_per_topic' = {caps!r} is invalid: expected an object "
                'mapping topic to records/s, e.g. {"orders": 500}'
            )
        values["max_rate_per_topic"] = {
            str(t): _coerce(source, f"max_rate_per_topic.{t}", v, RULES["max_rate_per_partition"])
            for t, v in caps.items()
        }
    settings = ControllerSettings(**values)

    # relations between keys
    if not settings.scaling_up_ratio > settings.scaling_down_ratio:
        raise SettingsError(
            f"{source}: key 'scaling_up_ratio' = {settings.scaling_up_ratio!r} must be greater than "
            f"'scaling_down_ratio' = {settings.scaling_down_ratio!r}"
        )
    if settings.target_ratio > settings.max_ratio:
        raise SettingsError(
            f"{source}: key 'target_ratio' = {settings.target_ratio!r} must be <= "
            f"'max_ratio' = {settings.max_ratio!r}"
        )
    if settings.min_records_per_batch > settings.max_records_per_batch:
        raise SettingsError(
            f"{source}: key 'min_records_per_batch' = {settings.min_records_per_batch!r} must be <= "
            f"'max_records_per_batch' = {settings.max_records_per_batch!r}"
        )
    if settings.max_executors < settings.min_executors:
        raise SettingsError(
            f"{source}: key 'max_executors' = {settings.max_executors!r} must be >= "
            f"'min_executors' = {settings.min_executors!r}"
        )
    return settings


def settings_help() -> str:
    """One line per key, with its default and allowed values: shown in the Variable's description."""
    defaults = ControllerSettings()
    lines = []
    for f in fields(ControllerSettings):
        if f.name in RULES:
            rule = RULES[f.name]
            lines.append(f"{f.name} (default {getattr(defaults, f.name)!r}; {rule.describe()}): {rule.doc}")
        else:
            lines.append(f"{f.name} (default {{}}): {f.metadata['map']}")
    return "\n".join(lines)
