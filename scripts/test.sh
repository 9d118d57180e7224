#!/usr/bin/env bash
# Run the whole test suite on this machine: installs everything first (see bootstrap.sh).
# Real parts only: Apache Kafka (KRaft) with Spark's Kafka connector, Spark (local[2] and a standalone master+worker), Airflow
# (dag.test against SQLite, and `airflow standalone` for the fault suite) and PostgreSQL.
#
#   bash scripts/test.sh                  # the whole suite, in three shards at once (below)
#   bash scripts/test.sh tests/unit -x    # extra arguments: one pytest run with them
#
# The whole suite runs as three pytest processes side by side (shards, below): one pytest alone kept
# a 2-core machine 54% busy on average (measured over the whole suite on 2026-11-26: it waits on
# batch intervals, timeouts, the scheduler and JVM start-ups), and two still left it 38% idle over
# minutes in a fast hour (2026-12-01, /proc/stat over the suite's last third), so three overlap (in
# the machine's slow hours the suite is bound by CPU and the third about even: docs/benchmarks.md).
# They share nothing but the PostgreSQL server (a schema per test): every server, Airflow home and
# temporary folder is per process. KBP_TEST_SHARDS=1 runs the whole suite in one pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/bootstrap.sh

# PostgreSQL for the ledger tests: as root, Debian's server is installed and started here; otherwise
# the test fixture starts a throw-away server from the PostgreSQL binaries on this machine.
stop_postgres=:
if [[ -z "${KBP_TEST_POSTGRES_URL:-}" && $EUID -eq 0 ]]; then
    eval "$(bash .ci/postgres.sh)"
    stop_postgres='bash .ci/postgres.sh stop >/dev/null 2>&1 || true'
    trap "$stop_postgres" EXIT
fi

PYTEST=(.venv/bin/python -m pytest -q --durations=30)
if [[ $# -gt 0 || "${KBP_TEST_SHARDS:-3}" == "1" ]]; then
    rc=0
    "${PYTEST[@]}" "$@" || rc=$?
    exit "$rc"
fi

# The two background shards, each a list of paths; the foreground shard runs the rest. The tests'
# walls (setup, call and teardown; KBP_TEST_CPU_LOG) in the fresh-clone rehearsal of 2026-12-01
# 16:19, with two shards then (3,106 s and 2,923 s of tests), chose them, about 2,000 s each:
# - the fault suite (its package's `airflow standalone`: 1,600 s) and modules that wait more than
#   they compute: the standalone cluster's scale-up and scale-down, the controller's delays, the
#   Delta S3 commit race, the Iceberg maintenance (2,088 s in all);
# - the tests that stop batches and wait for every process of theirs to end (batch_stop,
#   arrow_batch_stop), the Delta and typed-records pipelines, the cost mode settling on batches
#   that sleep per record, the secured-Kafka pipeline (1,964 s);
# - the foreground: the unit tests and every other integration test (1,977 s).
# The three-shard rehearsal of 2026-12-01 17:32 (a slow hour) ended them after 45:50, 49:22 and
# 53:47 (the tests' walls 2,748 s, 3,186 s and 3,302 s): four foreground modules that need no Spark
# Connect server (the first shard starts none) went to the first, 268 s of their walls there.
# The rehearsal of 2026-12-02 08:00 ended them after 51:54, 50:43 and 47:32 (the tests' walls 3,043 s,
# 3,033 s and 2,838 s): test_replay_reliability (117 s there) went from the foreground to the second
# background shard.
SHARDS=(
    "tests/faults tests/integration/test_standalone_executors.py tests/integration/test_controller_operators.py tests/integration/test_delta_s3_commit_race.py tests/integration/test_iceberg_maintenance.py tests/integration/test_fence_cleanup_remote.py tests/integration/test_connection_types.py tests/integration/test_broker_bounds.py tests/integration/test_local_cli.py"
    "tests/integration/test_batch_stop.py tests/integration/test_arrow_batch_stop.py tests/integration/test_delta_pipeline.py tests/integration/test_typed_records_e2e.py tests/integration/test_controller_e2e.py tests/integration/test_secured_kafka.py tests/integration/test_replay_reliability.py"
)
# the foreground names its folders: pytest's --ignore does not drop a folder that pyproject's
# testpaths names (tests/faults ran in both shards when the foreground relied on it)
FOREGROUND=(tests/unit tests/integration)
for shard in "${SHARDS[@]}"; do
    for path in $shard; do
        if [[ $path == tests/integration/* ]]; then FOREGROUND+=("--ignore=$path"); fi
    done
done

mkdir -p .tmp
start=$(date +%s)
# each background shard into its log; the foreground on the terminal
LOGS=()
PIDS=()
for i in "${!SHARDS[@]}"; do
    LOGS+=("$ROOT/.tmp/test-shard$((i + 2)).$$.log")
    # shellcheck disable=SC2086  # a shard is a list of paths
    "${PYTEST[@]}" ${SHARDS[$i]} > "${LOGS[$i]}" 2>&1 &
    PIDS+=($!)
done
# an interrupted run stops the background shards too (SIGTERM, since a background job ignores
# SIGINT: the fault rig turns it into an interrupt and stops Airflow, the broker and PostgreSQL it
# started)
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null || true; wait "${PIDS[@]}" 2>/dev/null || true; '"$stop_postgres" EXIT
rest=0
"${PYTEST[@]}" "${FOREGROUND[@]}" || rest=$?
echo "test.sh: the foreground shard: exit $rest after $(($(date +%s) - start)) s; waiting for the background shards"
failed=$rest
summary="foreground shard exit $rest"
for i in "${!SHARDS[@]}"; do
    rc=0
    wait "${PIDS[$i]}" || rc=$?
    echo "test.sh: ===== background shard $((i + 2)) (${SHARDS[$i]}), run beside it: ====="
    cat "${LOGS[$i]}"
    rm -f "${LOGS[$i]}"
    summary+="; background shard $((i + 2)) exit $rc"
    [[ $rc -eq 0 ]] || failed=$rc
done
trap "$stop_postgres" EXIT
echo "test.sh: $summary; $(($(date +%s) - start)) s in all"
[[ $failed -eq 0 ]]
