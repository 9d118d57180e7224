#!/usr/bin/env bash
# Run the whole test suite on this machine: installs everything first (see bootstrap.sh).
# Real parts only: Apache Kafka (KRaft) with Spark's Kafka connector, Spark (local[2] and a standalone master+worker), Airflow
# (dag.test against SQLite, and `airflow standalone` for the fault suite) and PostgreSQL.
#
#   bash scripts/test.sh                  # the whole suite, in two shards at once (below)
#   bash scripts/test.sh tests/unit -x    # extra arguments: one pytest run with them
#
# The whole suite runs as two pytest processes side by side (shards, below): one pytest alone kept
# a 2-core machine 54% busy on average (measured over the whole suite on 2026-11-26: it waits on
# batch intervals, timeouts, the scheduler and JVM start-ups), so the two overlap. They share
# nothing but the PostgreSQL server (a schema per test): every server, Airflow home and temporary
# folder is per process. KBP_TEST_SHARDS=1 runs the whole suite in one pytest.
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
if [[ $# -gt 0 || "${KBP_TEST_SHARDS:-2}" == "1" ]]; then
    rc=0
    "${PYTEST[@]}" "$@" || rc=$?
    exit "$rc"
fi

# The background shard: the fault suite, the secured-Kafka end-to-end tests and three modules that wait more than they compute (the
# standalone cluster's scale-up and scale-down, the controller's delays, the cost mode settling on
# batches that sleep per record), about half of the suite's time in one pytest; the rest, the Spark
# end-to-end tests above all, runs in the foreground. (The fresh-clone rehearsal of 147607a's parent:
# foreground 32 min, background 26 min; then the Delta tests of fencing, timeout and the connect
# engine, about 6 min, joined the foreground, and the cost mode's 4 min moved here. A rehearsal of
# ebbf9de on 2026-11-29: foreground 58.7 min, background 45.7 min; the two S3 drivers' commit race,
# 4 min, moved here; the Iceberg maintenance tests, about 1 min, joined it on 2026-11-30.)
BACKGROUND=(tests/faults tests/integration/test_standalone_executors.py tests/integration/test_controller_operators.py tests/integration/test_controller_e2e.py tests/integration/test_secured_kafka.py tests/integration/test_delta_s3_commit_race.py tests/integration/test_typed_records_e2e.py tests/integration/test_iceberg_pipeline.py tests/integration/test_iceberg_maintenance.py)
# the foreground names its folders: pytest's --ignore does not drop a folder that pyproject's
# testpaths names (tests/faults ran in both shards when the foreground relied on it)
FOREGROUND=(tests/unit tests/integration)
for path in "${BACKGROUND[@]}"; do
    if [[ $path == tests/integration/* ]]; then FOREGROUND+=("--ignore=$path"); fi
done

mkdir -p .tmp
FAULTS_LOG="$ROOT/.tmp/test-faults.$$.log"
start=$(date +%s)
# the background shard into its log; everything else on the terminal
"${PYTEST[@]}" "${BACKGROUND[@]}" > "$FAULTS_LOG" 2>&1 &
faults_pid=$!
# an interrupted run stops the fault suite too (SIGTERM, since a background job ignores SIGINT: the
# fault rig turns it into an interrupt and stops Airflow, the broker and PostgreSQL it started)
trap 'kill -TERM "$faults_pid" 2>/dev/null || true; wait "$faults_pid" 2>/dev/null || true; '"$stop_postgres" EXIT
rest=0
"${PYTEST[@]}" "${FOREGROUND[@]}" || rest=$?
echo "test.sh: the foreground shard: exit $rest after $(($(date +%s) - start)) s; waiting for the background shard"
faults=0
wait "$faults_pid" || faults=$?
trap "$stop_postgres" EXIT
echo "test.sh: ===== the background shard (${BACKGROUND[*]}), run beside it: ====="
cat "$FAULTS_LOG"
rm -f "$FAULTS_LOG"
echo "test.sh: background shard exit $faults; foreground shard exit $rest; $(($(date +%s) - start)) s in all"
[[ $rest -eq 0 && $faults -eq 0 ]]
