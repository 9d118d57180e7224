"""Our PIDRateEstimator against Spark's own class, in the JVM that ships with pyspark.

Spark's ``org.apache.spark.streaming.scheduler.rate.PIDRateEstimator`` is driven through py4j with
the same random inputs as ours; every result must be equal to the bit.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_kafka_backpressure.control.pid import PIDRateEstimator


@pytest.fixture(scope="module")
def spark_pid_class():
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import py4j.java_gateway
    import py4j.protocol
    from pyspark.java_gateway import launch_gateway

    # A SparkContext created earlier in this process (the suite's other Spark tests) left pyspark's
    # handler that converts Java exceptions through the active SparkContext's JVM patched into py4j;
    # this module's own gateway talks to py4j plainly, as it would in a fresh process.
    patched = py4j.java_gateway.get_return_value
    py4j.java_gateway.get_return_value = py4j.protocol.get_return_value
    gateway = launch_gateway()
    try:
        cls = gateway.jvm.org.apache.spark.streaming.scheduler.rate.PIDRateEstimator
        # a plain function: hypothesis probes fixtures' attributes, which py4j would forward to Java
        yield lambda *args: cls(*args)
    finally:
        py4j.java_gateway.get_return_value = patched
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:  # the JVM exits when its stdin closes
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except Exception:
                proc.kill()
                proc.wait(timeout=30)


def _spark(opt):
    return None if opt.isEmpty() else float(opt.get())


inputs = st.lists(
    st.tuples(
        st.integers(-100, 120_000),  # time step, sometimes backwards or zero
        st.integers(-5, 2_000_000),
        st.integers(-5, 600_000),
        st.integers(0, 600_000),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=inputs,
    interval=st.integers(1, 600_000),
    gains=st.tuples(st.floats(0, 5), st.floats(0, 5), st.floats(0, 5)),
    min_rate=st.floats(0.001, 10_000),
)
def test_same_estimates_as_sparks_pid_rate_estimator(spark_pid_class, batches, interval, gains, min_rate):
    kp, ki, kd = gains
    ours = PIDRateEstimator(interval, kp, ki, kd, min_rate)
    theirs = spark_pid_class(interval, kp, ki, kd, min_rate)
    t = 0
    for step, n, proc, sched in batches:
        t += step
        assert ours.compute(t, n, proc, sched) == _spark(theirs.compute(t, n, proc, sched))


@pytest.mark.parametrize(
    "args",
    [
        (0, 1.0, 2.0, 3.0, 10.0),
        (100, -1.0, 2.0, 3.0, 10.0),
        (100, 0.0, -1.0, 3.0, 10.0),
        (100, 0.0, 0.0, -1.0, 10.0),
        (100, 0.0, 0.0, 0.0, 0.0),
    ],
)
def test_same_argument_checks_as_spark(spark_pid_class, args):
    from py4j.protocol import Py4JJavaError

    with pytest.raises(Py4JJavaError, match="IllegalArgumentException"):
        spark_pid_class(*args)
    with pytest.raises(ValueError):
        PIDRateEstimator(*args)
