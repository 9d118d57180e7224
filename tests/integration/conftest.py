from pathlib import Path

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def delta_spark(spark_work_dir: Path, s3_server):
    """A local[2] SparkSession with Delta's jars and SQL extension and hadoop-aws on its JVM's class
    path (``extraClassPath``: nothing copied), for one test module; its JVM ends with the module."""
    from pyspark import SparkContext

    from kbp_local.jars import combined_spark_conf, spark_delta_conf, spark_s3a_conf
    from tests.fixtures_spark import local_session

    if SparkContext._active_spark_context is not None:
        pytest.fail(
            "another SparkContext is running in this test process: the Delta tests need a JVM started "
            "with Delta's jars and SQL extension; run the tests/integration/test_delta_*.py modules before "
            "modules that use the session-wide 'spark' fixture (the default order does)"
        )
    conf = {
        **combined_spark_conf(
            spark_delta_conf(jars="extraClassPath"), spark_s3a_conf(s3_server, jars="extraClassPath")
        ),
        "spark.sql.shuffle.partitions": "2",
        # small tables: one partition for Delta's snapshot state, not 50
        "spark.databricks.delta.snapshotPartitions": "1",
        # a short-lived JVM: the C1 compiler only (warms up in a fraction of the time)
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }
    with local_session(spark_work_dir, "kbp-delta-tests", conf) as session:
        yield session
