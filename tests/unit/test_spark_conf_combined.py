"""``local.jars.combined_spark_conf``: Spark settings of several bundles in one (pure)."""

from __future__ import annotations

import os

from kbp_local.jars import combined_spark_conf


def test_jar_lists_are_joined_in_order_and_other_keys_taken_from_the_last():
    delta = {
        "spark.jars": "/d/delta.jar",
        "spark.sql.extensions": "delta",
        "spark.driver.extraClassPath": "/d/*",
    }
    s3a = {
        "spark.jars": "/s/aws.jar",
        "spark.driver.extraClassPath": "/s/*",
        "spark.executor.extraClassPath": "/s/*",
    }
    later = {"spark.sql.extensions": "other", "spark.jars": ""}

    assert combined_spark_conf(delta, s3a, later) == {
        "spark.jars": "/d/delta.jar,/s/aws.jar",
        "spark.sql.extensions": "other",
        "spark.driver.extraClassPath": f"/d/*{os.pathsep}/s/*",
        "spark.executor.extraClassPath": "/s/*",
    }


def test_nothing_to_combine():
    assert combined_spark_conf() == {}
    assert combined_spark_conf({"spark.jars": "a"}) == {"spark.jars": "a"}
