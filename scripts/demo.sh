#!/usr/bin/env bash
# The demo, in one command: Apache Kafka (KRaft, one node, jars from Maven Central), a Schema Registry
# (Confluent's REST API), demo data in Avro through the registry (a burst with schema version 1, then a
# steady stream with version 2, a field added; every 2,000th record corrupt), a local Spark Connect
# server (local[2]) and `airflow standalone` on 127.0.0.1 with the demo pipeline's DAGs unpaused.
# Every minute the ingest DAG plans a batch with the controller, runs it on the Connect server (the
# connect engine; Spark's own Kafka reader, format("kafka")), decodes the values into typed columns
# and writes Parquet under .demo/sink, the corrupt records into each batch's _errors/. Ctrl-C
# stops everything this script started.
#
# Settings (environment): KBP_DEMO_DIR [.demo], KBP_DEMO_UI_PORT [8080, or a free port],
# KBP_DEMO_BROKER_PORT [19092, or a free port], KBP_DEMO_CONNECT_PORT [15002, or a free port],
# KBP_DEMO_REGISTRY_PORT [18081, or a free port],
# KBP_DEMO_RATE [200 records/s], KBP_DEMO_ENGINE [connect | submit: a spark-submit per batch],
# KBP_DEMO_INTERVAL [60: the batch interval, s], KBP_DEMO_BURST [30000: records produced before the steady
# stream; 0: none], KBP_DEMO_PIPELINES_FILE [the demo's pipeline: a pipelines file to run instead].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/bootstrap.sh

DEMO="$(mkdir -p "${KBP_DEMO_DIR:-$ROOT/.demo}" && cd "${KBP_DEMO_DIR:-$ROOT/.demo}" && pwd)"
PY="$ROOT/.venv/bin/python"
port_or_free() { "$PY" - "$1" <<'PY'
import socket, sys
want = int(sys.argv[1])
with socket.socket() as s:
    try:
        s.bind(("127.0.0.1", want)); print(want)
    except OSError:
        s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])
PY
}
UI_PORT="${KBP_DEMO_UI_PORT:-$(port_or_free 8080)}"
BROKER_PORT="${KBP_DEMO_BROKER_PORT:-$(port_or_free 19092)}"
CONNECT_PORT="${KBP_DEMO_CONNECT_PORT:-$(port_or_free 15002)}"
REGISTRY_PORT="${KBP_DEMO_REGISTRY_PORT:-$(port_or_free 18081)}"
REGISTRY="http://127.0.0.1:$REGISTRY_PORT"
BOOTSTRAP="127.0.0.1:$BROKER_PORT"
ENGINE="${KBP_DEMO_ENGINE:-connect}"
case "$ENGINE" in connect|submit) ;; *) echo "KBP_DEMO_ENGINE must be connect or submit, not '$ENGINE'" >&2; exit 2;; esac
TOPIC=demo-events
INTERVAL="${KBP_DEMO_INTERVAL:-60}"
BURST="${KBP_DEMO_BURST:-30000}"
[[ "$INTERVAL" =~ ^[1-9][0-9]*$ ]] || { echo "KBP_DEMO_INTERVAL must be whole seconds (e.g. 60), not '$INTERVAL'" >&2; exit 2; }
[[ "$BURST" =~ ^[0-9]+$ ]] || { echo "KBP_DEMO_BURST must be a number of records (0 for none), not '$BURST'" >&2; exit 2; }

# Every service runs in its own session (setsid), so stopping it stops all its children too.
pids=()
cleanup() {
    trap - EXIT INT TERM
    echo "stopping the demo ..." >&2
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for _ in $(seq 60); do
        alive=0
        for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
        [[ $alive -eq 0 ]] && return
        sleep 1
    done
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "starting the broker on $BOOTSTRAP" >&2
setsid "$PY" -m kbp_local broker --port "$BROKER_PORT" --work-dir "$DEMO/kafka" > "$DEMO/broker.out" 2>&1 &
pids+=($!)
for _ in $(seq 1200); do grep -q listening "$DEMO/broker.out" 2>/dev/null && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.1; done
grep -q listening "$DEMO/broker.out" || { echo "Kafka did not start; see $DEMO/broker.out and $DEMO/kafka/kafka.log" >&2; exit 1; }
echo "starting the Schema Registry on $REGISTRY" >&2
setsid "$PY" -m kbp_local schema-registry --port "$REGISTRY_PORT" > "$DEMO/schema-registry.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$DEMO/schema-registry.out" 2>/dev/null && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.1; done
grep -q listening "$DEMO/schema-registry.out" || { echo "the Schema Registry did not start; see $DEMO/schema-registry.out" >&2; exit 1; }
# Spark's Kafka connector and Avro functions for every spark-submit of the demo (the submit engine's batches)
"$PY" -m kbp_local spark-conf --dir "$DEMO/spark-conf" >&2
export SPARK_CONF_DIR="$DEMO/spark-conf"

echo "producing a burst of $BURST Avro demo records (schema version 1), then ${KBP_DEMO_RATE:-200} records/s (version 2)" >&2
AVRO=(--schema-registry "$REGISTRY" --schema-change-at "$BURST" --corrupt-every 2000)
"$PY" -m kbp_local produce --bootstrap "$BOOTSTRAP" --topic "$TOPIC" --partitions 4 --count "$BURST" "${AVRO[@]}" >&2
setsid "$PY" -m kbp_local produce --bootstrap "$BOOTSTRAP" --topic "$TOPIC" --partitions 4 \
    --start-id "$BURST" --rate "${KBP_DEMO_RATE:-200}" "${AVRO[@]}" > "$DEMO/producer.log" 2>&1 &
pids+=($!)

if [[ "$ENGINE" == connect ]]; then
    echo "starting a Spark Connect server (local[2]) on 127.0.0.1:$CONNECT_PORT" >&2
    setsid "$PY" -m kbp_local spark-connect --port "$CONNECT_PORT" \
        --work-dir "$DEMO/spark-connect" > "$DEMO/spark-connect.out" 2>&1 &
    pids+=($!)
fi

if [[ -n "${KBP_DEMO_PIPELINES_FILE:-}" ]]; then  # bench/pipelines.py: many pipelines, its own producers
    cp "$KBP_DEMO_PIPELINES_FILE" "$DEMO/pipelines.json"
else
cat > "$DEMO/pipelines.json" <<JSON
{"pipelines": [{"name": "demo", "topics": ["$TOPIC"], "sink": "$DEMO/sink", "engine": "$ENGINE",
                "batch_interval_s": $INTERVAL, "replay_interval_s": 300, "tags": ["demo"],
                "value_format": "avro", "schema_registry_conn_id": "schema_registry_default",
                "max_bad_records": 0.01}]}
JSON
fi

export AIRFLOW_HOME="$DEMO/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="$UI_PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$UI_PORT/execution/"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=30
export KBP_PIPELINES_FILE="$DEMO/pipelines.json"
export AIRFLOW_CONN_KAFKA_DEFAULT="{\"conn_type\": \"kafka\", \"extra\": {\"bootstrap.servers\": \"$BOOTSTRAP\"}}"
export AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT="{\"conn_type\": \"schema_registry\", \"host\": \"$REGISTRY\"}"
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}'
export AIRFLOW_CONN_SPARK_CONNECT_DEFAULT="{\"conn_type\": \"spark_connect\", \"host\": \"sc://127.0.0.1\", \"port\": $CONNECT_PORT}"
export SPARK_LOCAL_IP=127.0.0.1
export PATH="$ROOT/.venv/bin:$PATH"
mkdir -p "$AIRFLOW_HOME"

airflow db migrate > "$DEMO/airflow-migrate.log" 2>&1
# Start the controller with a small initial rate, so the backlog drains over several batches and
# the PID's rate can be watched climbing to the sustainable rate. Kept if it exists (user edits).
if ! airflow variables get kbp.demo.settings > /dev/null 2>&1; then
    airflow variables set kbp.demo.settings '{"initial_rate": 100, "min_rate": 10}' \
        --description "Gains and limits of the demo pipeline (see docs/reference/configuration.md)" > /dev/null
fi

if [[ "$ENGINE" == connect ]]; then  # started above; ready in ~10-30 s, before Airflow's first batch
    for _ in $(seq 180); do grep -q listening "$DEMO/spark-connect.out" 2>/dev/null && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 1; done
    grep -q listening "$DEMO/spark-connect.out" || { echo "the Spark Connect server did not start; see $DEMO/spark-connect.out and $DEMO/spark-connect/" >&2; exit 1; }
fi

echo "starting Airflow (airflow standalone) on http://127.0.0.1:$UI_PORT" >&2
setsid airflow standalone > "$DEMO/airflow.log" 2>&1 &
pids+=($!)
for _ in $(seq 240); do
    curl -fsS "http://127.0.0.1:$UI_PORT/api/v2/monitor/health" > /dev/null 2>&1 && break
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "airflow standalone exited; see $DEMO/airflow.log" >&2; exit 1; }
    sleep 1
done
curl -fsS "http://127.0.0.1:$UI_PORT/api/v2/monitor/health" > /dev/null || { echo "Airflow did not come up; see $DEMO/airflow.log" >&2; exit 1; }
PASSWORD_FILE="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
for _ in $(seq 30); do [[ -s "$PASSWORD_FILE" ]] && break; sleep 1; done
PASSWORD="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("admin", "?"))' "$PASSWORD_FILE" 2>/dev/null || echo '?')"

cat <<MSG

  Airflow UI   http://127.0.0.1:$UI_PORT      user: admin   password: $PASSWORD
  Monitor      http://127.0.0.1:$UI_PORT/plugin/kafka-backpressure   (Browse -> Kafka Backpressure)
  Broker       Apache Kafka $BOOTSTRAP, topic $TOPIC (4 partitions), ${KBP_DEMO_RATE:-200} records/s
  Registry     $REGISTRY: Avro values, schema version 2 from id $BURST, every 2,000th record corrupt
  Spark        engine $ENGINE$([[ "$ENGINE" == connect ]] && echo ", Connect server sc://127.0.0.1:$CONNECT_PORT (local[2])" || echo ", spark-submit --master local[2] per batch")
  Output       $DEMO/sink/batch_id=N/*.parquet (typed columns), bad records in $DEMO/sink/batch_id=N/_errors/
  Logs         $DEMO/*.log

  DAGs kbp_ingest_demo (every $INTERVAL s) and kbp_replay_demo (every 5 min) are unpaused.
  Tune the controller in Admin -> Variables -> kbp.demo.settings. Ctrl-C stops the demo.

MSG
wait "${pids[-1]}"
