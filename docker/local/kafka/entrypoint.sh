#!/usr/bin/env bash
# Apache Kafka (KRaft) configured like the apache/kafka image: every KAFKA_<NAME> variable becomes the
# server property <name> ("_" -> "."; KAFKA_HEAP_OPTS, KAFKA_OPTS and CLUSTER_ID are not properties).
# The storage is formatted on first start (kept when already formatted), then the server runs in
# the foreground.
set -euo pipefail
conf=/opt/kafka/config/server.properties
: > "$conf"
while IFS='=' read -r name value; do
    case "$name" in KAFKA_HEAP_OPTS|KAFKA_OPTS) continue ;; esac
    key="$(tr 'A-Z_' 'a-z.' <<< "${name#KAFKA_}")"
    printf '%s=%s\n' "$key" "$value" >> "$conf"
done < <(env | grep '^KAFKA_' | sort)
cat > /opt/kafka/config/log4j2.yaml <<'YAML'
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
YAML
java_cmd=(java ${KAFKA_HEAP_OPTS:--Xmx512m} ${KAFKA_OPTS:-} -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml -cp '/opt/kafka/libs/*')
cluster_id="${CLUSTER_ID:-$("${java_cmd[@]}" kafka.tools.StorageTool random-uuid)}"
"${java_cmd[@]}" kafka.tools.StorageTool format --ignore-formatted -t "$cluster_id" -c "$conf" >&2
echo "kafka-entrypoint: Apache Kafka with $conf:" >&2
cat "$conf" >&2
exec "${java_cmd[@]}" kafka.Kafka "$conf"
