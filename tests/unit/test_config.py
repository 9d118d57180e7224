"""Controller settings from a Variable: defaults equal Spark's, every invalid value is refused with
the key, the value and the allowed range."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.config.settings import (
    ControllerSettings,
    SettingsError,
    parse_settings,
    settings_help,
)

SRC = "Variable 'kbp.demo.settings'"


def test_defaults_equal_sparks():
    s = parse_settings("")
    assert (s.proportional, s.integral, s.derivative, s.min_rate) == (1.0, 0.2, 0.0, 100.0)
    assert (s.max_rate_per_partition, s.min_rate_per_partition, s.initial_rate) == (0, 1, 0)
    assert (s.scaling_up_ratio, s.scaling_down_ratio, s.min_executors) == (0.9, 0.3, 1)
    assert s.max_executors == 2**31 - 1
    assert parse_settings(None) == parse_settings("{}") == ControllerSettings()


def test_values_are_parsed_and_coerced():
    s = parse_settings(
        '{"proportional": 2, "min_rate": 5, "max_rate_per_partition": 100.0, '
        '"max_rate_per_topic": {"orders": 7}, "backpressure_enabled": false}'
    )
    assert s.proportional == 2.0 and isinstance(s.proportional, float)
    assert s.max_rate_per_partition == 100 and isinstance(s.max_rate_per_partition, int)
    assert s.backpressure_enabled is False
    limits = s.rate_limits([TopicPartition("orders", 0), TopicPartition("clicks", 0)])
    assert limits.max_rate(TopicPartition("orders", 0)) == 7
    assert limits.max_rate(TopicPartition("clicks", 0)) == 100


@pytest.mark.parametrize(
    "text, fragments",
    [
        ('{"integral": -1}', ["'integral'", "-1", "[0, inf)"]),
        ('{"min_rate": 0.5}', ["'min_rate'", "0.5", "[1, inf)", "unlimited"]),
        ('{"proportional": "high"}', ["'proportional'", "'high'", "not a number"]),
        ('{"max_rate_per_partition": 1.5}', ["'max_rate_per_partition'", "whole number"]),
        ('{"min_rate_per_partition": 0}', ["'min_rate_per_partition'", "[1, inf)"]),
        ('{"backpressure_enabled": "yes"}', ["'backpressure_enabled'", "true or false"]),
        ('{"min_executors": 0}', ["'min_executors'", "[1, inf)"]),
        ('{"scaling_up_ratio": 0.2}', ["'scaling_up_ratio'", "greater than", "'scaling_down_ratio'"]),
        ('{"min_executors": 4, "max_executors": 3}', ["'max_executors'", ">= 'min_executors'"]),
        ('{"integrall": 0.1}', ["unknown key", "'integrall'", "allowed keys"]),
        ('{"max_rate_per_topic": [1]}', ["'max_rate_per_topic'"]),
        ('{"max_rate_per_topic": {"orders": -1}}', ["max_rate_per_topic.orders", "-1"]),
        ('{"proportional": 1,}', ["not valid JSON", "line 1"]),
        ("[1, 2]", ["expected a JSON object"]),
        ('{"derivative": NaN}', ["'derivative'", "finite"]),
    ],
)
def test_invalid_values_name_the_variable_key_value_and_range(text, fragments):
    with pytest.raises(SettingsError) as e:
        parse_settings(text, source=SRC)
    msg = str(e.value)
    assert msg.startswith(SRC)
    for f in fragments:
        assert f in msg, (f, msg)


def test_round_trip_and_help():
    s = parse_settings('{"integral": 0.5, "max_rate_per_topic": {"a": 3}}')
    assert parse_settings(s.to_json()) == s
    assert "integral (default 0.2" in settings_help()


def test_derived_control_objects():
    s = parse_settings('{"proportional": 0.5, "cooldown_batches": 1, "max_executors": 4}')
    est = s.estimator(60_000)
    assert (est.batch_interval_ms, est.proportional) == (60_000, 0.5)
    policy = s.scaling_policy()
    assert (policy.cooldown_batches, policy.max_executors) == (1, 4)


def test_mode_and_cost_keys():
    s = parse_settings(
        '{"mode": "spark", "target_ratio": 0.7, "max_ratio": 0.95, "drain_horizon_s": 600, '
        '"cost_window_batches": 20, "max_records_per_batch": 50000}'
    )
    assert (s.mode, s.target_ratio, s.max_ratio, s.drain_horizon_s, s.cost_window_batches) == (
        "spark",
        0.7,
        0.95,
        600.0,
        20,
    )
    p = s.cost_params()
    assert (p.target_ratio, p.max_ratio, p.drain_horizon_s, p.window_batches) == (0.7, 0.95, 600.0, 20)
    assert s.rate_limits().max_records_per_batch == 50_000
    assert ControllerSettings().mode == "cost"  # the bench's winner (docs/benchmarks.md)


def test_the_gains_reach_the_cost_mode_and_the_wait_keys_default_off():
    p = parse_settings('{"proportional": 0.4, "integral": 0.05, "derivative": 0.1}').cost_params()
    assert (p.proportional, p.integral, p.derivative) == (0.4, 0.05, 0.1)
    s = ControllerSettings()
    assert (s.min_records_per_batch, s.max_batch_delay_s) == (0, 900.0)  # off; Spark's maxTriggerDelay 15 min
    assert (
        parse_settings('{"min_records_per_batch": 500, "max_batch_delay_s": 30}').min_records_per_batch == 500
    )


@pytest.mark.parametrize(
    "text, fragments",
    [
        ('{"mode": "pid"}', ["'mode' = 'pid'", "one of 'spark', 'cost'"]),
        ('{"mode": 1}', ["'mode'", "one of 'spark', 'cost'"]),
        ('{"target_ratio": 0}', ["'target_ratio'", "(0, 1]"]),
        ('{"max_ratio": 1.5}', ["'max_ratio'", "(0, 1]"]),
        ('{"target_ratio": 0.9, "max_ratio": 0.8}', ["'target_ratio' = 0.9", "<= 'max_ratio' = 0.8"]),
        ('{"drain_horizon_s": -5}', ["'drain_horizon_s'", "[0, inf)"]),
        ('{"cost_window_batches": 1}', ["'cost_window_batches'", "[2, inf)"]),
        ('{"proportional": -1}', ["'proportional' = -1", "[0, inf)", "cost: the correction's gain"]),
        ('{"min_records_per_batch": -1}', ["'min_records_per_batch' = -1", "[0, inf)"]),
        ('{"min_records_per_batch": 2.5}', ["'min_records_per_batch' = 2.5", "not a whole number"]),
        ('{"max_batch_delay_s": -1}', ["'max_batch_delay_s' = -1", "[0, inf)"]),
        ('{"min_batch_fixed_share": 1.5}', ["'min_batch_fixed_share' = 1.5", "[0, 1]"]),
        (
            '{"min_records_per_batch": 10, "max_records_per_batch": 5}',
            ["'min_records_per_batch' = 10", "<= 'max_records_per_batch' = 5"],
        ),
    ],
)
def test_cost_keys_are_validated(text, fragments):
    with pytest.raises(SettingsError) as e:
        parse_settings(text, source=SRC)
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_every_key_is_declared_once_with_its_rule():
    """Issue 23 item 5: the dataclass field is the one declaration (default, type, range, doc)."""
    from dataclasses import fields

    from airflow_kafka_backpressure.config.settings import MAP_KEYS, RULES

    names = [f.name for f in fields(ControllerSettings)]
    assert sorted(names) == sorted(set(RULES) | MAP_KEYS) and not set(RULES) & MAP_KEYS
    assert RULES["min_records_per_batch"].low == 0 and RULES["target_ratio"].high == 1.0
    assert len(settings_help().splitlines()) == len(names)
