#!/usr/bin/env bash
# Health check with the apache/kafka image's script path and arguments:
#   kafka-broker-api-versions.sh --bootstrap-server HOST:PORT
# succeeds when the broker accepts TCP connections there.
set -euo pipefail
server=""
while [[ $# -gt 0 ]]; do
    case "$1" in --bootstrap-server) server="$2"; shift 2 ;; *) shift ;; esac
done
[[ -n "$server" ]] || { echo "usage: $0 --bootstrap-server HOST:PORT" >&2; exit 2; }
exec 3<> "/dev/tcp/${server%:*}/${server##*:}"
