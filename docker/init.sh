#!/usr/bin/env bash
# One-shot initialisation of the compose stack (service airflow-init). Idempotent: run again, it
# keeps what exists — secrets, the admin password, connections and Variables edited in the UI.
#
#  1. secrets shared by the Airflow services (JWT secret, API secret key, Fernet key), the admin
#     password and Redis's password, in the airflow-secrets volume (the services read them through
#     *_CMD settings): redis.conf (its requirepass, which the redis service loads) and
#     celery_broker_url (redis://:password@KBP_REDIS_HOST:KBP_REDIS_PORT/0, the Celery broker);
#  2. the ledger's database on the PostgreSQL server (created when missing);
#  3. airflow db migrate;
#  4. connections kafka_default (the client properties kafka-users wrote: the brokers, SASL_SSL, the
#     SCRAM user), spark_default, spark_connect_default (the Connect server's token, which
#     spark-connect-secrets made, as its password; TLS), kbp_ledger (added when missing);
#  5. the demo pipeline's settings Variable (set when missing).
#
# Environment (set by compose.yaml): KBP_KAFKA_CLIENT_PROPERTIES, KBP_SPARK_MASTER_URL, KBP_SPARK_CONNECT_HOST,
# KBP_SPARK_CONNECT_PORT, KBP_SPARK_CONNECT_TOKEN_FILE (optional: a file holding the Connect server's
# token, the connection's password), KBP_SPARK_CONNECT_USE_SSL (true: the connection's extra is
# {"use_ssl": true}), KBP_LEDGER_HOST, KBP_LEDGER_PORT, KBP_LEDGER_USER, KBP_LEDGER_PASSWORD,
# KBP_LEDGER_DB, KBP_REDIS_HOST, KBP_REDIS_PORT, AIRFLOW_ADMIN_PASSWORD, KBP_DEMO_SETTINGS_KEY,
# KBP_DEMO_SETTINGS.
set -euo pipefail
log() { echo "airflow-init: $*" >&2; }
need() { [[ -n "${!1:-}" ]] || { log "ERROR: environment variable $1 is not set (see docker/compose.yaml)"; exit 1; }; }
for v in KBP_KAFKA_CLIENT_PROPERTIES KBP_SPARK_MASTER_URL KBP_SPARK_CONNECT_HOST KBP_SPARK_CONNECT_PORT KBP_LEDGER_HOST \
         KBP_LEDGER_PORT KBP_LEDGER_USER KBP_LEDGER_PASSWORD KBP_LEDGER_DB KBP_REDIS_HOST KBP_REDIS_PORT; do
    need "$v"
done

SECRETS=/opt/airflow/secrets
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

python - "$SECRETS" <<'PY'
import base64, json, os, secrets, sys
d = sys.argv[1]
def keep_or_write(name, value):
    path = os.path.join(d, name)
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return True
keep_or_write("jwt_secret", secrets.token_urlsafe(64))
keep_or_write("api_secret_key", secrets.token_urlsafe(32))
keep_or_write("fernet_key", base64.urlsafe_b64encode(os.urandom(32)).decode())
# Redis's password (URL-safe characters: it goes into the broker URL as it is), then the two files
# made from it, rewritten on each start (the host or port may have changed; the password stays)
keep_or_write("redis_password", secrets.token_urlsafe(24))
with open(os.path.join(d, "redis_password")) as f:
    redis_password = f.read().strip()
for name, value in (
    ("redis.conf", f"requirepass {redis_password}\n"),
    ("celery_broker_url", f"redis://:{redis_password}@{os.environ['KBP_REDIS_HOST']}:{os.environ['KBP_REDIS_PORT']}/0"),
):
    if os.path.exists(os.path.join(d, name)):
        os.unlink(os.path.join(d, name))
    keep_or_write(name, value)
# the admin's password: AIRFLOW_ADMIN_PASSWORD, else one generated on the first start and logged once
given = os.environ.get("AIRFLOW_ADMIN_PASSWORD", "")
if keep_or_write("passwords.json", json.dumps({"admin": given or secrets.token_urlsafe(12)})) and not given:
    with open(os.path.join(d, "passwords.json")) as f:
        print(f"airflow-init: generated the Airflow admin's password: {json.load(f)['admin']} "
              "(kept in the airflow-secrets volume; set AIRFLOW_ADMIN_PASSWORD to choose one)", file=sys.stderr)
PY
log "secrets ready in $SECRETS"

python - <<'PY'
import os, psycopg2
from psycopg2 import sql
e = os.environ
db = e["KBP_LEDGER_DB"]
conn = psycopg2.connect(host=e["KBP_LEDGER_HOST"], port=int(e["KBP_LEDGER_PORT"]), user=e["KBP_LEDGER_USER"],
                        password=e["KBP_LEDGER_PASSWORD"], dbname="postgres", connect_timeout=10)
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
    if cur.fetchone() is None:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        print(f"airflow-init: created the ledger database {db!r}", flush=True)
conn.close()
PY

log "airflow db migrate"
airflow db migrate > "$WORK/migrate.log" 2>&1 || { cat "$WORK/migrate.log" >&2; exit 1; }

python - "$WORK/connections.json" <<'PY'
import json, os, sys
e = os.environ
connections = {
    "kafka_default": {
        "conn_type": "kafka",
        "description": "Kafka cluster of the demo pipeline: SASL_SSL, SCRAM user (librdkafka-style keys in extra)",
        "extra": open(e["KBP_KAFKA_CLIENT_PROPERTIES"]).read(),
    },
    "spark_default": {
        "conn_type": "spark",
        "description": "Spark standalone master; client deploy mode (the job hands metrics back through a file)",
        "host": e["KBP_SPARK_MASTER_URL"],
        "extra": json.dumps({"deploy-mode": "client", "spark-binary": "spark-submit"}),
    },
    "spark_connect_default": {
        "conn_type": "spark_connect",
        "description": "Spark Connect server on the standalone master (engine: connect); password: its token",
        "host": e["KBP_SPARK_CONNECT_HOST"],
        "port": int(e["KBP_SPARK_CONNECT_PORT"]),
    },
    "kbp_ledger": {
        "conn_type": "postgres",
        "description": "Ledger of the Kafka backpressure pipelines (batches and offset ranges)",
        "host": e["KBP_LEDGER_HOST"],
        "port": int(e["KBP_LEDGER_PORT"]),
        "login": e["KBP_LEDGER_USER"],
        "password": e["KBP_LEDGER_PASSWORD"],
        "schema": e["KBP_LEDGER_DB"],
    },
}
token_file = e.get("KBP_SPARK_CONNECT_TOKEN_FILE", "")
if token_file:
    with open(token_file) as f:
        token = f.read().strip()
    if not token:
        sys.exit(f"airflow-init: ERROR: {token_file} (the Spark Connect server's token) is empty")
    connections["spark_connect_default"]["password"] = token
if e.get("KBP_SPARK_CONNECT_USE_SSL", "").lower() == "true":
    connections["spark_connect_default"]["extra"] = json.dumps({"use_ssl": True})
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    json.dump(connections, f)
PY
log "connections (existing ones are kept)"
airflow connections import "$WORK/connections.json" >&2

if [[ -n "${KBP_DEMO_SETTINGS_KEY:-}" && -n "${KBP_DEMO_SETTINGS:-}" ]]; then
    python - "$WORK/variables.json" <<'PY'
import json, os, sys
value = json.loads(os.environ["KBP_DEMO_SETTINGS"])  # fail here, clearly, on invalid JSON
with open(sys.argv[1], "w") as f:
    json.dump({os.environ["KBP_DEMO_SETTINGS_KEY"]: json.dumps(value)}, f)
PY
    log "Variable $KBP_DEMO_SETTINGS_KEY (kept if it exists)"
    airflow variables import --action-on-existing-key skip "$WORK/variables.json" >&2
fi
log "done"
