#!/usr/bin/env bash
# The compose stack, tested for real on a machine of this project's kind (Debian, root, no image
# registry, no bridge networks allowed). Run by .ci/run after the test suite:
#
#   bash docker/test.sh
#
#  1. installs docker.io, docker-compose (v1) and debootstrap with apt, when missing;
#  2. starts its own Docker engine (no bridge, no iptables; state, socket and logs under .tmp/);
#  3. builds a Debian bookworm base image with debootstrap, a wheelhouse from the host's pip, the
#     stack's image on that base, and stand-ins for the three images that cannot be pulled here:
#     Kafka (Apache Kafka from Maven Central's jars, on the stack's image), PostgreSQL and Redis
#     (Debian's);
#  4. brings up docker/compose.yaml with docker/compose.hostnet.yaml (host networking, ports from
#     docker/hostnet.env) and docker/compose.test.yaml (the suite's JVM flags: C1, serial GC) and 2
#     Spark workers, the demo pipeline of docker/pipelines.json with a 30 s lease and a replay look
#     every 30 s (60 s each there; KBP_PIPELINES_JSON), and checks that no network was created;
#  5. waits for 2 batches of the demo pipeline with a change of executor count; waits until batches
#     with records have run on both Celery workers (airflow-worker-1, airflow-worker-2: their task
#     instances' hostnames, docker/check_workers.py), SIGKILLs and removes the container of the worker
#     whose ingest task is running a batch in Spark, and checks that the batch is recovered on the
#     other (the scheduler fails the dead task, the replay DAG re-runs the batch once its ledger
#     lease expires; nothing but PostgreSQL and the sink is shared); checks that the
#     topic and the group offsets are on 3 replicas; SIGKILLs Kafka node kafka-1 while a batch runs
#     in Spark, starts it again 20 s later, and waits until that batch has finished (succeeded, or
#     failed and replayed) and kafka-1 is back in sync; stops the producer,
#     turns backpressure off (a settings Variable edit), waits until the pipeline has caught up
#     after >= 3 batches with records, then checks (docker/check_sink.py) that
#     every produced record is in the sink exactly once and that the executors per batch moved
#     with the target — in the ledger, on the monitoring page and in the worker containers;
#     checks the Spark Connect server from the surviving worker through the spark_connect_default
#     connection: TLS with a certificate for spark-connect from the stack's CA, a client without
#     the token or with a wrong one refused (UNAUTHENTICATED), one with it running a query; and that
#     the token is in the server's environment only (no command line, no UI page, no container log,
#     none of this test's output); that Redis refuses a client without its password, and that the
#     password is in the secrets volume only (no command line, container configuration or log, no
#     task log, none of this test's output);
#  6. tears everything down, also on failure: containers, volumes, images, the engine, its mounts
#     and its state.
#
# Settings (environment): KBP_DOCKER_KEEP_IMAGES=1 keeps the engine's image store in
# .tmp/docker-images for the next run (faster, for developers); KBP_DOCKER_TIMEOUT_S [900] bounds
# each wait for the pipeline; KBP_DOCKER_STACK_AFTER=FILE builds everything, then waits until FILE
# exists before it brings the stack up (.ci/run builds the images while the test suite runs and
# starts the stack once the suite has ended, so the stack and the suite never share the 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
HERE="$ROOT/docker"
PROJECT=kbptest
KEEP="${KBP_DOCKER_KEEP_IMAGES:-0}"
WAIT_S="${KBP_DOCKER_TIMEOUT_S:-900}"
STACK_AFTER="${KBP_DOCKER_STACK_AFTER:-}"
W="$ROOT/.tmp/docker-test"                                  # scratch: logs, build contexts, socket
STORE="$ROOT/.tmp/docker-$([[ $KEEP == 1 ]] && echo images || echo test-store)"   # the engine's data-root
export DOCKER_HOST="unix://$W/docker.sock"
export KBP_IMAGE=kbp/airflow-kafka-backpressure:test
export KAFKA_IMAGE=kbp/apache-kafka:test
export POSTGRES_IMAGE=kbp/postgres:test
export REDIS_IMAGE=kbp/redis:test
# a task whose worker vanished is failed after 60 s without a heartbeat (the stack's default: 120 s)
export AIRFLOW_TASK_HEARTBEAT_TIMEOUT_S="${AIRFLOW_TASK_HEARTBEAT_TIMEOUT_S:-60}"
# the scheduler's, DAG processor's and triggerer's health checks every 5 minutes, not every minute:
# each is an `airflow jobs check` (4.7 s of CPU on the loaded machine, measured on 2026-12-01), and the
# three at 60 s took an eighth of the 2 cores the stack keeps busy. Nothing waits on their health.
export AIRFLOW_JOB_CHECK_INTERVAL="${AIRFLOW_JOB_CHECK_INTERVAL:-300s}"
# a smaller demo backlog and stream than users get: less to read on a busy 2-core machine
export KBP_DEMO_BURST="${KBP_DEMO_BURST:-4000}" KBP_DEMO_RATE="${KBP_DEMO_RATE:-20}"
BASE_IMAGE=kbp/bookworm-base:test
PY="$ROOT/.venv/bin/python"
set -a
# shellcheck source=hostnet.env
source "$HERE/hostnet.env"   # the ports; compose reads the same file
set +a
CHECK_ENDPOINTS=(--postgres "postgresql://airflow:airflow@127.0.0.1:$POSTGRES_PORT/kbp"
       --airflow "http://127.0.0.1:$AIRFLOW_PORT" --spark-ui "http://127.0.0.1:$SPARK_MASTER_WEBUI_PORT")

T0=$(date +%s)
PHASE_START=$T0
PHASE=""
TIMINGS=()
phase() {
    local now
    now=$(date +%s)
    [[ -n "$PHASE" ]] && TIMINGS+=("$(printf '%-44s %5d s' "$PHASE" $((now - PHASE_START)))")
    PHASE="$1"
    PHASE_START=$now
    [[ -n "$1" ]] && echo "docker/test.sh: == $1" >&2
    return 0
}
say() { echo "docker/test.sh: $*" >&2; }
REASON=""   # what failed, repeated on the last lines (the service logs printed on failure are long)
die() { REASON="$*"; say "ERROR: $*"; exit 1; }
trap '[[ -n "$REASON" ]] || REASON="line $LINENO: $BASH_COMMAND"' ERR
# check <command> ...: docker/check_stack.py, its "check FAILED" line kept as the reason
# (its progress goes to stdout; stderr, with the failure, is shown once it ends)
check() { run_check check_stack.py "$@"; }
# check_workers <command> ...: the same for docker/check_workers.py (the Celery workers); run_check
# <script> <command> ... for the others (check_sink.py: the final check; check_secrets.py)
check_workers() { run_check check_workers.py "$@"; }
run_check() {
    local script="$1" err="$W/check-$2.err" rc=0
    shift
    PATH="/usr/bin:$PATH" "$ROOT/.venv/bin/python" "$HERE/$script" "${CHECK_ENDPOINTS[@]}" "$@" 2> "$err" || rc=$?
    cat "$err" >&2
    [[ $rc -eq 0 ]] || die "docker/$script $1: exit $rc: $(verdict "$err")"
}

# verdict FILE: a check's output's reason: its own "check FAILED" line, else its last line (an
# unexpected error's traceback ends so)
verdict() {
    local line
    line="$(grep -h 'check FAILED' "$1" | tail -n 1 || true)"
    echo "${line:-$(tail -n 1 "$1")}"
}

# in_stack <command> ...: docker/check_stack.py inside the stack (a one-off container of the stack's
# image on the host's network, the service names mapped as compose.hostnet.yaml maps them), a
# client of the cluster's CLIENT listeners with kafka-users' properties (SASL_SSL, SCRAM)
in_stack() {
    docker run --rm -i --network host --add-host kafka-1:127.0.0.1 --add-host kafka-2:127.0.0.1 \
        --add-host kafka-3:127.0.0.1 -v "${PROJECT}_kafka-tls:/etc/kafka/tls:ro" \
        -v "${PROJECT}_kafka-client:/opt/kbp/kafka-client:ro" "$KBP_IMAGE" \
        python - --properties-file /opt/kbp/kafka-client/client.json "$@" < "$HERE/check_stack.py"
}

# docker: the engine's own client (a newer one without buildx may come first on PATH)
docker() { /usr/bin/docker "$@"; }
compose() {
    docker-compose -p "$PROJECT" --env-file "$HERE/hostnet.env" \
        -f "$HERE/compose.yaml" -f "$HERE/compose.hostnet.yaml" -f "$HERE/compose.test.yaml" "$@"
}

DOCKERD_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    phase "teardown"
    if [[ -n "$DOCKERD_PID" ]] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
        if [[ $rc -ne 0 ]]; then
            say "failed: the last lines of each service's log follow (all logs: $W/logs)"
            mkdir -p "$W/logs"
            for c in $(docker ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}' 2>/dev/null); do
                docker logs "$c" > "$W/logs/$c.log" 2>&1 || true
                echo "---- $c" >&2
                tail -n 15 "$W/logs/$c.log" >&2 || true
            done
        fi
        # the test is over, its logs kept: no graceful stops (with -t 20 the teardown took 35-43 s,
        # the JVMs and Airflow's processes ending in turn)
        compose down -v --remove-orphans -t 0 > "$W/down.log" 2>&1 || say "compose down failed (see $W/down.log)"
        kill -TERM "$DOCKERD_PID" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$DOCKERD_PID" 2>/dev/null || true
    fi
    # the engine leaves its network namespace and overlay mounts mounted when killed
    grep -o " $W/exec[^ ]*\| $STORE[^ ]*" /proc/mounts 2>/dev/null | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    [[ "$KEEP" == 1 ]] || rm -rf "$STORE"
    [[ $rc -eq 0 ]] && rm -rf "$W"
    phase ""
    echo "docker/test.sh: timings" >&2
    printf '  %s\n' "${TIMINGS[@]}" >&2
    printf '  %-44s %5d s\n' "total" $(($(date +%s) - T0)) >&2
    if [[ $rc -eq 0 ]]; then
        echo "docker/test.sh: PASSED"
        echo "docker: 1 passed, 0 failed"
    else
        echo "docker/test.sh: FAILED (exit $rc; logs kept in $W): ${REASON:-interrupted}"
        echo "docker: 0 passed, 1 failed"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
phase "install docker.io, docker-compose"
[[ $EUID -eq 0 ]] || die "run as root: it installs packages and starts a Docker engine"
if ! command -v dockerd > /dev/null || ! command -v docker-compose > /dev/null || ! command -v debootstrap > /dev/null \
    || [[ ! -x /usr/bin/docker ]]; then
    export DEBIAN_FRONTEND=noninteractive
    # one apt at a time: .ci/run builds the stack beside the test suite, whose PostgreSQL set-up may apt too
    flock -w 900 /tmp/kbp-apt.lock sh -c \
        'apt-get update -qq > /dev/null && apt-get install -y -qq docker.io docker-compose debootstrap > /dev/null' 
fi
bash scripts/bootstrap.sh                      # the host's .venv: pip for the wheelhouse, the checks

phase "start dockerd"
rm -rf "$W"
mkdir -p "$W" "$STORE"
setsid dockerd -H "$DOCKER_HOST" --pidfile "$W/dockerd.pid" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --storage-driver=overlay2 --data-root="$STORE" --exec-root="$W/exec" > "$W/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 120); do
    docker info > /dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -n 20 "$W/dockerd.log" >&2; die "dockerd exited (log: $W/dockerd.log)"; }
    sleep 0.5
done
docker info > /dev/null 2>&1 || die "dockerd did not answer within 60 s (log: $W/dockerd.log)"
docker network ls --format '{{.Name}}' | sort > "$W/networks.before"

phase "base image (debootstrap)"
if ! docker image inspect "$BASE_IMAGE" > /dev/null 2>&1; then
    DOCKER=/usr/bin/docker bash "$HERE/local/base-image.sh" "$BASE_IMAGE" "$W/base"
fi

phase "wheelhouse (host pip)"
# the dependencies' wheels, through the host's pip (its registry, certificates and cache); the image
# builds the package itself from source. Skipped when pyproject.toml and constraints.txt are unchanged.
# async-timeout: the Redis client needs it on Python < 3.11.3 (the image's Debian Python is 3.11.2),
# which a host's newer Python does not pull in
WANT="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$HERE/wheels/.complete" 2>/dev/null)" != "$WANT" ]]; then
    rm -f "$HERE"/wheels/*.whl
    "$PY" -m pip wheel -q --disable-pip-version-check -c constraints.txt -w "$HERE/wheels" \
        '.[postgres,celery]' asyncpg async-timeout 'setuptools>=77' wheel > "$W/wheelhouse.log" 2>&1 \
        || { grep -v "is ignored" "$W/wheelhouse.log" | tail -n 20 >&2; die "pip wheel failed (log: $W/wheelhouse.log)"; }
    rm -f "$HERE"/wheels/airflow_provider_kafka_backpressure-*.whl
    echo "$WANT" > "$HERE/wheels/.complete"
fi

# Spark's Kafka connector for the image (SPARK_HOME/jars), from the host's jar cache
rm -f "$HERE"/jars/*.jar
cp "$("$PY" -c 'from kbp_local.jars import spark_kafka_jars; print(spark_kafka_jars())')"/*.jar "$HERE/jars/"

phase "image $KBP_IMAGE"
docker build --network host -f "$HERE/Dockerfile" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg PIP_INSTALL_OPTIONS=--no-index -t "$KBP_IMAGE" . > "$W/build-kbp.log" 2>&1 \
    || { tail -n 30 "$W/build-kbp.log" >&2; die "docker build of $KBP_IMAGE failed (log: $W/build-kbp.log)"; }

phase "stand-in images (Apache Kafka from Maven Central's jars, PostgreSQL, Redis)"
mkdir -p "$W/kafka/jars"
cp "$HERE"/local/kafka/* "$W/kafka/"
cp "$("$PY" -c 'from kbp_local.jars import kafka_broker_jars; print(kafka_broker_jars())')"/*.jar "$W/kafka/jars/"
docker build -q --network host --build-arg "BASE_IMAGE=$KBP_IMAGE" -t "$KAFKA_IMAGE" "$W/kafka" > "$W/build-kafka.log" 2>&1 \
    || { cat "$W/build-kafka.log" >&2; die "docker build of $KAFKA_IMAGE failed"; }
docker build -q --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$POSTGRES_IMAGE" "$HERE/local/postgres" > "$W/build-postgres.log" 2>&1 \
    || { cat "$W/build-postgres.log" >&2; die "docker build of $POSTGRES_IMAGE failed"; }
docker build -q --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$REDIS_IMAGE" "$HERE/local/redis" > "$W/build-redis.log" 2>&1 \
    || { cat "$W/build-redis.log" >&2; die "docker build of $REDIS_IMAGE failed"; }

if [[ -n "$STACK_AFTER" ]]; then
    phase "wait for $STACK_AFTER (the images are built)"
    until [[ -e "$STACK_AFTER" ]]; do sleep 2; done
fi

phase "stack up (2 Spark workers)"
# the demo pipeline with a 30 s lease and a replay look every 30 s (docker/pipelines.json: 60 s each):
# the batch of the worker killed below waits out both before the survivor replays it
"$PY" - "$HERE/pipelines.json" "$W/pipelines.json" <<'EOF'
import json, sys
spec = json.load(open(sys.argv[1]))
for p in spec["pipelines"]:
    p.update(lease_s=30, replay_interval_s=30)
json.dump(spec, open(sys.argv[2], "w"), indent=1)
EOF
export KBP_PIPELINES_JSON="$W/pipelines.json"
for p in $(sed -n 's/^[A-Z0-9_]*PORT=\([0-9]*\)$/\1/p' "$HERE/hostnet.env") 27182; do
    ! ss -Hltn "sport = :$p" | grep -q . || die "port $p on this machine is in use; the stack needs the ports of docker/hostnet.env (and 27182 for the second worker's UI)"
done
compose up -d --no-build --scale spark-worker=2 > "$W/up.log" 2>&1 || { cat "$W/up.log" >&2; die "docker-compose up failed"; }
docker network ls --format '{{.Name}}' | sort > "$W/networks.after"
diff "$W/networks.before" "$W/networks.after" > /dev/null \
    || die "a network was created: $(comm -13 "$W/networks.before" "$W/networks.after" | tr '\n' ' ')"
say "no network created ($(tr '\n' ' ' < "$W/networks.after"))"
compose ps >&2
# the admin's password as a user gets it: generated by airflow-init on the first start, logged once
if [[ -z "${AIRFLOW_ADMIN_PASSWORD:-}" ]]; then
    for _ in $(seq 150); do
        AIRFLOW_ADMIN_PASSWORD="$(docker logs "${PROJECT}_airflow-init_1" 2>&1 \
            | sed -n "s/.*generated the Airflow admin's password: \([^ ]*\) .*/\1/p" | tail -n 1)"
        [[ -n "$AIRFLOW_ADMIN_PASSWORD" ]] && break
        sleep 2
    done
    [[ -n "$AIRFLOW_ADMIN_PASSWORD" ]] || die "airflow-init logged no generated admin password"
    export AIRFLOW_ADMIN_PASSWORD
    say "the admin's generated password was logged by airflow-init"
fi

phase "2 batches, executor count changes"
check wait-batches --min 2 --timeout "$WAIT_S"

phase "2 Celery workers: batches on both, one killed mid-batch"
check_workers wait-both --workers airflow-worker-1 airflow-worker-2 --timeout "$WAIT_S"
check wait-in-spark --write-to "$W/in-flight" --timeout "$WAIT_S"
BATCH="$(cat "$W/in-flight")"
check_workers running-on --batch "$BATCH" --write-to "$W/worker"
DEAD="$(cat "$W/worker")"
case "$DEAD" in
    airflow-worker-1) SURVIVOR=airflow-worker-2 ;;
    airflow-worker-2) SURVIVOR=airflow-worker-1 ;;
    *) die "batch $BATCH runs on $DEAD, not on one of the two workers" ;;
esac
KILLED_AT=$(date +%s)
docker kill --signal KILL "${PROJECT}_${DEAD}_1" > /dev/null
docker rm -f "${PROJECT}_${DEAD}_1" > /dev/null
say "$DEAD killed (SIGKILL) and removed while its ingest task ran batch $BATCH in Spark; $SURVIVOR is left"
check_workers recovered --batch "$BATCH" --dead "$DEAD" --survivor "$SURVIVOR" --since "$KILLED_AT" --timeout "$WAIT_S"

phase "kafka-1 killed mid-batch and restarted"
# the cluster as the pipeline sees it: its topic and the group offsets' topic on 3 replicas, in sync
in_stack replication --timeout 120 > "$W/replication.log" 2>&1 || { cat "$W/replication.log" >&2; die "replication check failed: $(verdict "$W/replication.log")"; }
grep "^check:" "$W/replication.log" >&2
check wait-in-spark --write-to "$W/in-flight" --timeout "$WAIT_S"
BATCH="$(cat "$W/in-flight")"
docker kill --signal KILL "${PROJECT}_kafka-1_1" > /dev/null
say "kafka-1 killed (SIGKILL) while batch $BATCH was running in Spark; restarted in 20 s"
sleep 20
docker start "${PROJECT}_kafka-1_1" > /dev/null
check wait-finished --batch "$BATCH" --timeout "$WAIT_S"
in_stack replication --timeout 300 > "$W/replication.log" 2>&1 || { cat "$W/replication.log" >&2; die "kafka-1 did not rejoin: $(verdict "$W/replication.log")"; }
grep "^check:" "$W/replication.log" >&2

phase "stop producer, catch up, >= 3 batches"
compose stop -t 30 demo-producer > /dev/null 2>&1
docker logs "${PROJECT}_demo-producer_1" > "$W/producer.log" 2>&1
grep "produced" "$W/producer.log" >&2 || true
# backpressure off (a Variable edit, as in the UI): the next batches read up to the latest offsets
check unthrottle
# the brokers advertise their service names: ask for the end offsets from inside the stack
ENDS="$(in_stack end-offsets 2> "$W/end-offsets.log")" || { cat "$W/end-offsets.log" >&2; die "could not read the end offsets: $(verdict "$W/end-offsets.log")"; }
check wait-caught-up --end-offsets "$ENDS" --min-batches 3 --replays --timeout "$WAIT_S"

phase "verify sink and executors"
SINK="$(docker volume inspect "${PROJECT}_sink" --format '{{.Mountpoint}}')/sink/demo"
mapfile -t WORKERS < <(docker ps --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=spark-worker" --format '{{.Names}}')
[[ ${#WORKERS[@]} -eq 2 ]] || die "expected 2 spark-worker containers, found: ${WORKERS[*]:-none}"
run_check check_sink.py verify \
    --sink "$SINK" --producer-log "$W/producer.log" --workers "${WORKERS[@]}"

phase "Spark Connect: token and TLS"
CONNECT="${PROJECT}_spark-connect_1"
for _ in $(seq 150); do
    [[ "$(docker inspect -f '{{.State.Health.Status}}' "$CONNECT" 2>/dev/null)" == healthy ]] && break
    sleep 2
done
[[ "$(docker inspect -f '{{.State.Health.Status}}' "$CONNECT")" == healthy ]] \
    || die "$CONNECT is not healthy after 300 s (its TLS proxy or the Connect server does not listen)"
# from a worker, where the connect engine's sessions start: its connection, its CA setting
docker exec -i "${PROJECT}_${SURVIVOR}_1" timeout 600 python - connect-auth \
    < "$HERE/check_stack.py" > "$W/connect-auth.log" 2>&1 \
    || { tail -n 30 "$W/connect-auth.log" >&2; die "Spark Connect check failed: $(verdict "$W/connect-auth.log")"; }
grep "^check:" "$W/connect-auth.log" >&2
# the token (read from its volume here, never printed) is nowhere it must not be
run_check check_secrets.py connect-exposure --project "$PROJECT" --container "$CONNECT" \
    --token-file "$(docker volume inspect "${PROJECT}_spark-connect-secrets" --format '{{.Mountpoint}}')/token" \
    --connect-ui "http://127.0.0.1:$SPARK_CONNECT_UI_PORT" --files "$W"/*.log "$W"/*.err

phase "Redis: its password required, and kept secret"
# the password (read from its volume here, never printed) is in the secrets volume's files only
run_check check_secrets.py broker-secret --project "$PROJECT" --redis-port "$REDIS_PORT" \
    --password-file "$(docker volume inspect "${PROJECT}_airflow-secrets" --format '{{.Mountpoint}}')/redis_password" \
    --dirs "$(docker volume inspect "${PROJECT}_airflow-logs" --format '{{.Mountpoint}}')" --files "$W"/*.log "$W"/*.err
