#!/usr/bin/env bash
# Official-image behaviour, reduced to what the stack uses: as root, fix ownership and drop to the
# postgres user; on an empty PGDATA, initdb with POSTGRES_USER/POSTGRES_PASSWORD (password logins
# from the network) and create POSTGRES_DB; then run the command ("postgres -c ... -p ...").
set -euo pipefail
if [[ "${1:-}" == postgres && "$(id -u)" == 0 ]]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [[ "${1:-}" == postgres && ! -s "$PGDATA/PG_VERSION" ]]; then
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    [[ -n "${POSTGRES_PASSWORD:-}" ]] || { echo "docker-entrypoint: set POSTGRES_PASSWORD" >&2; exit 1; }
    pwfile="$(mktemp)"
    printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 > /dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [[ "$db" != postgres ]]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | postgres --single -D "$PGDATA" postgres > /dev/null
    fi
    echo "docker-entrypoint: initialised $PGDATA (user $user, database $db)" >&2
fi
exec "$@"
