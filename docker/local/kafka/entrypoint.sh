#!/usr/bin/env bash
# Apache Kafka (KRaft) configured like the apache/kafka image: every KAFKA_<NAME> variable becomes the
# server property <name>, lower case, with the image's rules: "___" -> "-", "__" -> "_", "_" -> "."
# (KAFKA_LISTENER_NAME_CLIENT_SCRAM___SHA___512_SASL_JAAS_CONFIG is
# listener.name.client.scram-sha-512.sasl.jaas.config). KAFKA_HEAP_OPTS, KAFKA_OPTS and CLUSTER_ID
# are not properties.
# The storage is formatted on first start (kept when already formatted), then the server runs in
# the foreground.
set -euo pipefail
conf=/opt/kafka/config/server.properties
: > "$conf"
while IFS='=' read -r name value; do
    case "$name" in KAFKA_HEAP_OPTS|KAFKA_OPTS) continue ;; esac
    key="$(tr 'A-Z' 'a-z' <<< "${name#KAFKA_}" | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')"
    printf '%s=%s\n' "$key" "$value" >> "$conf"
done < <(env | grep '^KAFKA_' | sort)
log4j2="$(/opt/venv/bin/python -c 'from kbp_local.apache_kafka import LOG4J2_CONFIG; print(LOG4J2_CONFIG)')"
# KAFKA_OPTS last before the main class, as in Kafka's kafka-run-class.sh: a user's log4j2 file wins
java_cmd=(java ${KAFKA_HEAP_OPTS:--Xmx512m} -Dlog4j2.configurationFile=$log4j2 ${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*')
cluster_id="${CLUSTER_ID:-$(/opt/venv/bin/python -c 'from kbp_local.apache_kafka import new_cluster_id; print(new_cluster_id())')}"
"${java_cmd[@]}" kafka.tools.StorageTool format --ignore-formatted --cluster-id="$cluster_id" -c "$conf" >&2
echo "kafka-entrypoint: Apache Kafka with $conf:" >&2
cat "$conf" >&2
exec "${java_cmd[@]}" kafka.Kafka "$conf"
