#!/usr/bin/env bash
# Start Tansu with the PLAINTEXT listener of KAFKA_LISTENERS / KAFKA_ADVERTISED_LISTENERS (the
# apache/kafka image's settings; the KRaft ones do not apply to Tansu). Tansu listens on every
# interface when given a host name, so the listener's host is resolved to its address first.
set -euo pipefail

plaintext() {  # the host:port of the PLAINTEXT listener in a Kafka listener list
    local item
    IFS=, read -ra items <<< "$1"
    for item in "${items[@]}"; do
        case "$item" in PLAINTEXT://*) echo "${item#PLAINTEXT://}"; return 0 ;; esac
    done
    return 1
}

listen="$(plaintext "${KAFKA_LISTENERS:-PLAINTEXT://:9092}")" \
    || { echo "kafka-entrypoint: KAFKA_LISTENERS has no PLAINTEXT listener: ${KAFKA_LISTENERS:-}" >&2; exit 1; }
advertised="$(plaintext "${KAFKA_ADVERTISED_LISTENERS:-}")" || advertised="$listen"
host="${listen%:*}"
port="${listen##*:}"
if [[ -z "$host" ]]; then
    address=0.0.0.0
else
    address="$(getent ahostsv4 "$host" | awk 'NR == 1 {print $1}')"
    [[ -n "$address" ]] || { echo "kafka-entrypoint: cannot resolve listener host '$host'" >&2; exit 1; }
fi
echo "kafka-entrypoint: Tansu on $address:$port, advertised as $advertised" >&2
exec /usr/local/bin/tansu broker --listener-url "tcp://$address:$port" \
    --advertised-listener-url "tcp://$advertised" --storage-engine memory://tansu/
