#!/usr/bin/env bash
# Health check with the apache/kafka image's script path and arguments:
#   kafka-broker-api-versions.sh --bootstrap-server HOST:PORT
# succeeds when the broker answers a Kafka Metadata request there (the provider's probe, from the
# image's Python).
set -euo pipefail
server=""
while [[ $# -gt 0 ]]; do
    case "$1" in --bootstrap-server) server="$2"; shift 2 ;; *) shift ;; esac
done
[[ -n "$server" ]] || { echo "usage: $0 --bootstrap-server HOST:PORT" >&2; exit 2; }
exec /opt/venv/bin/python -c 'import sys
from kbp_local.broker import metadata_ok
sys.exit(0 if metadata_ok(sys.argv[1], timeout_s=10) else 1)' "$server"
