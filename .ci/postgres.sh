#!/usr/bin/env bash
# Start a PostgreSQL server for the ledger tests and print how to reach it.
#
#   eval "$(.ci/postgres.sh)"        # installs Debian's postgresql if missing, starts, creates user/db
#   .venv/bin/pytest tests/integration/test_ledger.py -q
#   .ci/postgres.sh stop             # stops the server (the data directory is kept)
#
# Made for a fresh Debian machine, as root, without systemd. Idempotent: a server that is already
# running is reused, an existing data directory is started again. The only thing written to stdout is
#   export KBP_TEST_POSTGRES_URL='postgresql+psycopg2://USER:PASSWORD@127.0.0.1:PORT/DB'
# everything else goes to stderr.
#
# It runs its own server (initdb route), separate from Debian's "main" cluster, so it works whether
# or not the package's cluster exists or runs, and never touches port 5432 by default.
#
# Settings (environment):
#   KBP_PG_DIR       base directory (data/, run/ for the socket, postgres.log)  [/var/lib/kbp-postgres]
#   KBP_PG_PORT      TCP port on 127.0.0.1                                      [54329]
#   KBP_PG_USER      login role for the tests (CREATEDB CREATEROLE)              [kbp]
#   KBP_PG_PASSWORD  its password                                                [kbp]
#   KBP_PG_DB        database owned by that role                                 [kbp_test]
#   KBP_PG_OS_USER   OS user the server runs as when this script runs as root    [postgres]
set -euo pipefail

BASE="${KBP_PG_DIR:-/var/lib/kbp-postgres}"
PORT="${KBP_PG_PORT:-54329}"
DB_USER="${KBP_PG_USER:-kbp}"
DB_PASSWORD="${KBP_PG_PASSWORD:-kbp}"
DB_NAME="${KBP_PG_DB:-kbp_test}"
OS_USER="${KBP_PG_OS_USER:-postgres}"
DATA="$BASE/data"
RUN="$BASE/run"
LOG="$BASE/postgres.log"

log() { echo "postgres.sh: $*" >&2; }
die() { echo "postgres.sh: ERROR: $*" >&2; exit 1; }

for v in DB_USER DB_NAME; do
    [[ "${!v}" =~ ^[a-z_][a-z0-9_]*$ ]] || die "$v='${!v}' must be a plain lower-case SQL identifier"
done
[[ "$PORT" =~ ^[0-9]+$ ]] || die "KBP_PG_PORT='$PORT' is not a port number"

find_bin() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" && -x "$d/psql" ]]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

# Run a command as the server's OS user (initdb and postgres refuse to run as root).
as_owner() {
    if [[ $EUID -eq 0 ]]; then
        (cd / && runuser -u "$OS_USER" -- "$@")
    else
        "$@"
    fi
}

BIN="$(find_bin || true)"

if [[ "${1:-start}" == "stop" ]]; then
    [[ -n "$BIN" && -f "$DATA/PG_VERSION" ]] || { log "no server in $DATA"; exit 0; }
    if as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >&2
    else
        log "server in $DATA is not running"
    fi
    exit 0
fi
[[ "${1:-start}" == "start" ]] || die "usage: $0 [start|stop]"

# 1. Binaries: Debian's postgresql package when missing.
if [[ -z "$BIN" ]]; then
    [[ $EUID -eq 0 ]] || die "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
    log "installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    # one apt at a time (.ci/run builds docker/test.sh's images meanwhile, which may apt too)
    flock -w 900 /tmp/kbp-apt.lock sh -c 'apt-get update >&2 && apt-get install -y --no-install-recommends postgresql >&2' 
    BIN="$(find_bin)" || die "postgresql was installed but no /usr/lib/postgresql/*/bin has initdb, pg_ctl, postgres and psql"
fi
VERSION="$(basename "$(dirname "$BIN")")"
log "using PostgreSQL $VERSION from $BIN"

if [[ $EUID -eq 0 ]]; then
    id -u "$OS_USER" >/dev/null 2>&1 || die "OS user '$OS_USER' does not exist (Debian's postgresql package creates 'postgres'); set KBP_PG_OS_USER"
fi

# 2. Data directory (once).
mkdir -p "$BASE" "$RUN"
if [[ $EUID -eq 0 ]]; then
    chown "$OS_USER": "$BASE" "$RUN"
    chmod 0755 "$BASE"
fi
if [[ -f "$DATA/PG_VERSION" ]]; then
    DATA_VERSION="$(cat "$DATA/PG_VERSION")"
    [[ "$DATA_VERSION" == "$VERSION" ]] || die "$DATA holds a PostgreSQL $DATA_VERSION cluster but the binaries are $VERSION; remove $DATA (test data only) or set KBP_PG_DIR"
else
    log "initdb $DATA"
    as_owner "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 >&2
fi

# 3. Server (unless it already runs).
if as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    RUNNING_PORT="$(sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true)"
    [[ "$RUNNING_PORT" == "$PORT" ]] || die "the server in $DATA already runs on port ${RUNNING_PORT:-?}, not $PORT; run '$0 stop' first or set KBP_PG_PORT=$RUNNING_PORT"
    log "server in $DATA already running on 127.0.0.1:$PORT"
else
    if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; then
        die "another server already listens on 127.0.0.1:$PORT; set KBP_PG_PORT to a free port"
    fi
    [[ $EUID -ne 0 ]] || { touch "$LOG"; chown "$OS_USER": "$LOG"; }
    log "starting the server on 127.0.0.1:$PORT (log: $LOG)"
    if ! as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $RUN -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >&2; then
        tail -n 30 "$LOG" >&2 || true
        die "the server did not start; see $LOG"
    fi
fi

# 4. Role and database (idempotent), as the superuser over the unix socket.
psql_su() {
    as_owner "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PORT" -U postgres -d postgres "$@"
}
SQL_PASSWORD="${DB_PASSWORD//\'/\'\'}"
if [[ "$(psql_su -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" != "1" ]]; then
    log "creating role $DB_USER"
    psql_su -c "CREATE ROLE $DB_USER LOGIN CREATEDB CREATEROLE PASSWORD '$SQL_PASSWORD'" >&2
else
    psql_su -c "ALTER ROLE $DB_USER LOGIN CREATEDB CREATEROLE PASSWORD '$SQL_PASSWORD'" >&2
fi
if [[ "$(psql_su -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != "1" ]]; then
    log "creating database $DB_NAME"
    psql_su -c "CREATE DATABASE $DB_NAME OWNER $DB_USER" >&2
fi

# 5. Check the way the tests connect: TCP, password.
PGPASSWORD="$DB_PASSWORD" "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$DB_USER" \
    -d "$DB_NAME" -tAc "SELECT 1" >/dev/null \
    || die "cannot log in as $DB_USER to $DB_NAME on 127.0.0.1:$PORT"

urlencode() {
    local LC_ALL=C s="$1" out="" c i
    for ((i = 0; i < ${#s}; i++)); do
        c="${s:i:1}"
        case "$c" in
            [A-Za-z0-9._~-]) out+="$c" ;;
            *) out+="$(printf '%%%02X' "'$c")" ;;
        esac
    done
    printf '%s' "$out"
}
ENC_PASSWORD="$(urlencode "$DB_PASSWORD")"
URL="postgresql+psycopg2://$DB_USER:$ENC_PASSWORD@127.0.0.1:$PORT/$DB_NAME"
log "ready: $DB_USER@127.0.0.1:$PORT/$DB_NAME"
printf "export KBP_TEST_POSTGRES_URL='%s'\n" "$URL"
