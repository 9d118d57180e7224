"""The session's ``java`` (tests/spark_class_archive.py), run with a script that prints its
arguments as the real java: it must hand the JVM a class path that starts with the one the class
archive was made with."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.spark_class_archive import java_home_without_conf_dir


def _args(tmp_path: Path, *args: str) -> list[str]:
    real = tmp_path / "real-java"
    real.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    real.chmod(0o755)
    home = java_home_without_conf_dir(tmp_path, Path("/conf dir"), str(real))
    out = subprocess.run([str(home / "bin" / "java"), *args], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_conf_dir_leaves_the_class_path(tmp_path):
    assert _args(tmp_path, "-Xmx1g", "-cp", "/conf dir/:/spark/jars/*", "Main") == [
        "-Xmx1g",
        "-cp",
        "/spark/jars/*",
        "Main",
    ]


def test_an_extra_class_path_before_the_conf_dir_goes_after_sparks_jars(tmp_path):
    # Spark's launcher: spark.driver.extraClassPath, the conf dir, then Spark's own jars
    cp = "/d/delta.jar:/a/aws bundle.jar:/conf dir/:/spark/jars/slf4j.jar:/spark/jars/*"
    assert _args(tmp_path, "-cp", cp, "org.apache.spark.deploy.SparkSubmit") == [
        "-cp",
        "/spark/jars/slf4j.jar:/spark/jars/*:/d/delta.jar:/a/aws bundle.jar",
        "org.apache.spark.deploy.SparkSubmit",
    ]


def test_a_class_path_without_the_conf_dir_is_left_as_it_is(tmp_path):
    cp = "/d/delta.jar:/other/conf:/spark/jars/*"
    assert _args(tmp_path, "-cp", cp, "Main") == ["-cp", cp, "Main"]
