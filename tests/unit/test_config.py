"""Controller settings from a Variable: defaults equal Spark's, every invalid value is refused with
the key, the value and the allowed range."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.config import ControllerSettings, SettingsError, parse_settings, settings_help
from airflow_kafka_backpressure.models import TopicPartition

SRC = "Variable 'kbp.demo.settings'"


def test_defaults_equal_sparks():
    s = parse_settings("")
    assert (s.proportional, s.integral, s.derivative, s.min_rate) == (1.0, 0.2, 0.0, 100.0)
    assert (s.max_rate_per_partition, s.min_rate_per_partition, s.initial_rate) == (0, 1, 0)
    assert (s.scaling_up_ratio, s.scaling_down_ratio, s.min_executors) == (0.9, 0.3, 1)
    assert s.max_executors == 2**31 - 1
    assert parse_settings(None) == parse_settings("{}") == ControllerSettings()


def test_values_are_parsed_and_coerced():
    s = parse_settings('{"proportional": 2, "min_rate": 5, "max_rate_per_partition": 100.0, '
                       '"max_rate_per_topic": {"orders": 7}, "backpressure_enabled": false}')
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
        ('{"min_rate": 0}', ["'min_rate'", "(0, inf)"]),
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
