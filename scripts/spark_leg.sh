#!/usr/bin/env bash
# One focused leg of the version matrix (issue 43): the tests that touch what changes between Spark
# releases, run on another Spark minor than the default one.
#
#   bash scripts/spark_leg.sh 4.1             # pyspark 4.1.1: Spark's Kafka connector, spark-avro and Delta 4.3.1 at it
#   bash scripts/spark_leg.sh 4.0             # pyspark 4.0.0, Delta 4.0.0
#   bash scripts/spark_leg.sh 4.1 --ci        # CI's leg: the few tests of CI_TESTS below (.ci/run runs it)
#   bash scripts/spark_leg.sh 4.1 --prepare   # only install the release and fetch its jars (no test)
#
# The leg's environment is .venv with pyspark and pyspark-client of that minor's release
# (kbp_local.jars.SPARK_RELEASES: the release constraints/spark-<minor>.txt pins) installed into
# .tmp/spark-<minor> and put first on PYTHONPATH, which every process the tests start inherits
# (Airflow's tasks, spark-submit, the Connect server: SPARK_HOME is that pyspark). Every other
# package is what constraints/spark-<minor>.txt pins too: the files differ only in those two lines.
# The jars (Kafka connector, spark-avro, Delta) follow the pyspark found (kbp_local/jars.py).
#
# What the leg covers (docs/versions.md): the Delta and Iceberg sinks' protocols; the batch job with both readers
# (native and python), exactly once; Delta and Iceberg through the pipeline; the pipeline end to end on both engines (spark-submit and a
# Connect server of that release), a failed batch and its replay; the record decoders (from_avro,
# from_json) in the job and through the Connect server; the monitoring page's API.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
minor="${1:?usage: scripts/spark_leg.sh <spark minor: 4.0 | 4.1 | 4.2> [--ci | --prepare] [pytest args]}"
shift
mode=modules
if [[ "${1:-}" == --ci || "${1:-}" == --prepare ]]; then
    mode="${1#--}"
    shift
fi
# CI's leg (issue 43, .ci/run): one test for each thing that changes between Spark releases, the
# rest of the modules below staying a developer's run. The batch job exactly once with both readers
# (the spark writer reads with Spark's Kafka connector, the arrow writer's tasks with the Python
# reader), and a batch re-run through spark-submit of that release as the submit engine runs it
# (the production command line, the package zip on --py-files); Delta of that release
# through the pipeline on a Connect server of that release, with a failed batch and its replay by
# the replay DAG (test_pipeline_e2e's replay test on the connect engine, in CI's legs until
# 2026-12-01, covered nothing more that changes between Spark releases); from_avro of that
# release's spark-avro; the monitoring page's API. About 3 minutes a leg on 2 cores.
# test_pipeline_e2e's three runs on the submit engine were in CI's legs until 2026-12-02: what they
# ran of that release (spark-submit of the job) the test_spark_job re-run runs too, and the rest
# (the operators, the controller, the ledger) does not change between Spark releases; they were the
# legs' costliest test (196-415 s beside the compose stack, the rehearsal of 2026-12-02 04:38).
CI_TESTS=(
    "tests/integration/test_delta_pipeline.py::test_a_delta_pipeline_ingests_fails_replays_and_rewrites_each_record_once[connect-local]"
    "tests/integration/test_spark_job.py::test_three_batches_and_a_rerun_hold_every_record_exactly_once"
    "tests/integration/test_record_decoders.py::test_avro_with_a_compatible_change_mid_stream_and_bad_records"
    "tests/integration/test_ui_plugin.py::test_pipelines_and_batches_json_hold_the_ledger_numbers"
)
release="$(.venv/bin/python -c "from kbp_local.jars import SPARK_RELEASES as r; print(r.get('$minor', ''))")"
[[ -n "$release" ]] || { echo "spark_leg: no tested release of Spark $minor (kbp_local.jars.SPARK_RELEASES)" >&2; exit 2; }
overlay="$ROOT/.tmp/spark-$minor"
if [[ "$(cat "$overlay/.release" 2>/dev/null)" != "$release" ]]; then
    echo "spark_leg: installing pyspark and pyspark-client $release into $overlay" >&2
    rm -rf "$overlay"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps --target "$overlay" \
        "pyspark==$release" "pyspark-client==$release" >&2
    echo "$release" > "$overlay/.release"
fi
.venv/bin/python -m kbp_local.pyspark_bytecode "$overlay/pyspark" >&2
export PYTHONPATH="$overlay${PYTHONPATH:+:$PYTHONPATH}"
got="$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')"
[[ "$got" == "$release" ]] || { echo "spark_leg: pyspark $got on the path, not $release" >&2; exit 1; }
echo "spark_leg: Spark $release" >&2
.venv/bin/python -c 'from kbp_local import jars; jars.spark_kafka_jars(); jars.delta_jars(); jars.spark_avro_conf()' >&2
if [[ $mode == prepare ]]; then
    echo "spark_leg: Spark $release installed, its jars fetched" >&2
    exit 0
fi
if [[ $mode == ci ]]; then
    exec .venv/bin/python -m pytest -q --durations=10 -p no:cacheprovider "${CI_TESTS[@]}" "$@"
fi
# the Delta modules first: they start their own JVM (with Delta's jars) before any module's session
exec .venv/bin/python -m pytest -q --durations=15 -p no:cacheprovider \
    tests/integration/test_delta_sink.py \
    tests/integration/test_delta_pipeline.py \
    tests/integration/test_iceberg_sink.py \
    tests/integration/test_iceberg_pipeline.py \
    tests/integration/test_spark_job.py \
    tests/integration/test_pipeline_e2e.py \
    tests/integration/test_record_decoders.py \
    tests/integration/test_ui_plugin.py \
    "$@"
