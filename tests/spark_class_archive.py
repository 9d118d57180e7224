"""A class-data-sharing archive for the test session's Spark JVMs (a test-speed measure, not the product's).

A Spark driver JVM loads some 10,000 classes before it runs a job; most of a short spark-submit's
JVM time is spent loading and verifying them. Java's AppCDS keeps them, parsed, in an archive that
every later JVM maps instead: built once by one small job run with ``-XX:ArchiveClassesAtExit``,
then used through ``-XX:SharedArchiveFile``. Measured here on 2026-11-27 (a local[2] job writing
and reading Parquet, C1 flags of tests/conftest.py): 10.0 s wall and 11.7 s of CPU per
spark-submit without it, 6.0 s and 7.4 s with it; building it took 30 s once.

The archive sits in ``.tmp/`` keyed by the Java build and the Spark version, so the two pytest
shards of scripts/test.sh (and later runs) share it; a lock lets one of them build it while the
other waits. Whatever goes wrong (a JVM without a base archive, a failed build) leaves the session
without it and the JVMs as they were: an archive the JVM cannot use is ignored by it
(``-Xshare:auto``).

One obstacle: a JVM maps an archive only where no directory on its class path holds files, and
Spark puts ``SPARK_CONF_DIR`` first on every driver's class path, while the session's conf dir
holds ``spark-defaults.conf``. Spark reads that file by its path (the launcher and SparkSubmit
both), never from the class path, and the session's conf dir holds nothing else, so the session's
Spark JVMs run through a ``java`` (``JAVA_HOME`` of :func:`java_home_without_conf_dir`) that drops
exactly that class-path entry and runs the real ``java``.

A second one: a JVM maps an archive only where its class path starts with the one the archive was
made with (it may add entries after it), and Spark's launcher puts ``spark.driver.extraClassPath``
first of all, before the conf dir and Spark's jars: the Delta, Iceberg and S3A tests' JVMs (Delta,
hadoop-aws and the AWS SDK on the class path, as a cluster's image would carry them) ran without
the archive. The same ``java`` moves those entries to the end of the class path. They hold none of
Spark's classes (Delta's, Iceberg's, hadoop-aws' and the SDK's own packages), so no class resolves
differently. Measured here on 2026-12-02, each test alone and paired with the archive unused: the
Iceberg pipeline test on S3 (spark-submit) 130 -> 100 s of CPU, two Delta-on-S3 pipeline tests 204
-> 179 s, a spark-submit with Delta's jars on that class path 14-15 -> 9 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

_WARM_UP_JOB = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("kbp-class-archive").getOrCreate()
df = spark.range(0, 5000).selectExpr("id", "cast(id as string) as v", "id % 7 as p", "cast(cast(id as string) as binary) as b")
df = df.mapInArrow(lambda batches: batches, df.schema)
df.write.mode("overwrite").parquet(sys.argv[1])
print(spark.read.parquet(sys.argv[1]).groupBy("p").count().count())
spark.stop()
"""

BUILD_TIMEOUT_S = 300

_JAVA = """#!/usr/bin/env bash
# tests/spark_class_archive.py: the real java, with the session's SPARK_CONF_DIR taken off its -cp
# and the entries Spark put before it (spark.driver.extraClassPath) moved to its end
conf_dir={conf_dir}
args=()
while (( $# )); do
    if [[ $1 == -cp ]]; then
        IFS=: read -r -a entries <<< "$2"
        extra=() rest=() seen=0
        for entry in "${{entries[@]}}"; do
            if [[ $entry == "$conf_dir" || $entry == "$conf_dir/" ]]; then seen=1
            elif (( seen )); then rest+=("$entry")
            else extra+=("$entry")
            fi
        done
        if (( seen )); then
            joined="$(IFS=:; echo "${{rest[*]}}${{extra[*]:+:}}${{extra[*]}}")"
            args+=(-cp "$joined"); shift 2; continue
        fi
    fi
    args+=("$1"); shift
done
exec {java} "${{args[@]}}"
"""


def java_home_without_conf_dir(tmp_root: Path, conf_dir: Path, java: str) -> Path:
    """A ``JAVA_HOME`` whose ``bin/java`` runs ``java`` with ``conf_dir`` taken off a ``-cp`` class
    path that holds it and the entries before it (Spark's extraClassPath) moved to its end (Spark's
    launcher runs ``$JAVA_HOME/bin/java``); everything else passes through unchanged. ``conf_dir``
    must hold nothing a JVM loads from its class path, the moved entries none of Spark's classes."""
    import shlex

    home = (
        tmp_root.resolve()
        / "spark-class-archive"
        / f"java-home-{hashlib.sha256(str(conf_dir).encode()).hexdigest()[:12]}"
    )
    binary = home / "bin" / "java"
    text = _JAVA.format(conf_dir=shlex.quote(str(conf_dir)), java=shlex.quote(java))
    if not binary.exists() or binary.read_text() != text:
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_name(f"java.{os.getpid()}")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.rename(binary)
    return home


def _key(java_opts: str, conf_dir: Path) -> str:
    import pyspark

    version = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    return hashlib.sha256(f"{version}|{pyspark.__version__}|{java_opts}|{conf_dir}".encode()).hexdigest()[:16]


def shared_spark_class_archive(
    tmp_root: Path, java_opts: str, conf_dir: Path, java_home: Path
) -> Path | None:
    """The archive for Spark JVMs run with ``java_opts`` and ``SPARK_CONF_DIR=conf_dir``, built
    under a lock if it is not there yet; None when it cannot be built here.

    The conf dir is the first entry of a Spark JVM's class path, and a JVM uses an archive only
    where its class path starts with the one the archive was made with: the JVMs that are to
    share it must share the conf dir's path too (tests/conftest.py keys it by its content), and run
    through ``java_home`` (:func:`java_home_without_conf_dir`)."""
    folder = tmp_root.resolve() / "spark-class-archive"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        archive = folder / f"{_key(java_opts, conf_dir)}.jsa"
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"no class archive for Spark's JVMs ({exc})", stacklevel=2)
        return None
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        return _build(archive, java_opts, conf_dir, java_home)


def _build(archive: Path, java_opts: str, conf_dir: Path, java_home: Path) -> Path | None:
    work = archive.with_suffix(".work")
    work.mkdir(exist_ok=True)
    job = work / "warm_up.py"
    job.write_text(_WARM_UP_JOB)
    partial = archive.with_suffix(".partial")
    env = dict(os.environ, SPARK_CONF_DIR=str(conf_dir), JAVA_HOME=str(java_home))
    env["SPARK_SUBMIT_OPTS"] = f"{java_opts} -XX:ArchiveClassesAtExit={partial}"
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    cmd = [
        "spark-submit",
        "--master",
        "local[2]",
        "--conf",
        f"spark.local.dir={work}",
        str(job),
        str(work / "out"),
    ]
    try:
        proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"no class archive for Spark's JVMs: {exc}", stacklevel=3)
        return None
    if proc.returncode != 0 or not partial.exists():
        tail = (proc.stdout + proc.stderr)[-2000:]
        print(f"spark_class_archive: not built (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return None
    partial.rename(archive)
    shutil.rmtree(work, ignore_errors=True)
    return archive
