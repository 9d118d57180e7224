"""Checks of the running compose stack, from outside it (run by docker/test.sh on the host).

    python docker/check_stack.py wait-batches   --min 2 [--timeout 900]
    python docker/check_stack.py wait-in-spark  --write-to FILE [--timeout 900]
    python docker/check_stack.py wait-finished  --batch N [--timeout 900]
    python docker/check_stack.py unthrottle
    python - --properties-file client.json end-offsets < docker/check_stack.py   (inside the stack: JSON)
    python - --properties-file client.json replication < docker/check_stack.py   (inside the stack)
    python docker/check_stack.py wait-caught-up --end-offsets JSON [--min-batches 3] [--replays] [--timeout 600]
    python - connect-auth < docker/check_stack.py             (in an Airflow container of the stack)

It reads the ledger with plain SQL (PostgreSQL), the broker's end offsets with kafka-python,
Airflow's REST API with requests and the Spark master's JSON: nothing of the provider's own code, so
a bug there cannot hide itself. The final check of the sink: docker/check_sink.py. The broker
advertises its service name, which only resolves inside the stack: ``end-offsets`` runs in a
container of the stack (it needs nothing but kafka-python), and its output is handed to
``wait-caught-up``. ``connect-auth`` runs in an Airflow container (a Celery worker, where the
connect engine's sessions start): it reads the ``spark_connect_default`` connection through the
Spark provider's hook and talks to the Connect server with pyspark's client, through the container's
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH; it never prints the token. Where the token and Redis's password
must not be: docker/check_secrets.py.

Endpoints (defaults: this machine's hostnet.env): --postgres, --airflow, --spark-ui; Kafka:
--properties-file, a JSON file of librdkafka-style client properties (the stack's kafka-users writes
it: bootstrap servers, SASL_SSL, the SCRAM user).
Exit status 0 when the check holds; otherwise 1 with a message saying what was wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

PIPELINE = "demo"
TOPIC = "demo-events"
DONE = ("succeeded", "replayed")


class CheckFailed(Exception):
    pass


def log(msg: str) -> None:
    print(f"check: {msg}", flush=True)


def batches(args: argparse.Namespace) -> list[dict]:
    import psycopg2

    conn = psycopg2.connect(args.postgres, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT batch_id, status, records, executors, processing_ms, error FROM kbp_batches "
                "WHERE pipeline = %s ORDER BY batch_id",
                (PIPELINE,),
            )
            cols = [c[0] for c in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]
    except psycopg2.errors.UndefinedTable:
        return []  # no batch planned yet: the ledger creates its tables on first use
    finally:
        conn.close()


def range_heads(args: argparse.Namespace) -> dict[int, int]:
    import psycopg2

    conn = psycopg2.connect(args.postgres, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT r.partition, max(r.until_offset) FROM kbp_ranges r JOIN kbp_batches b "
                "ON b.batch_id = r.batch_id WHERE r.pipeline = %s AND r.topic = %s AND b.status IN %s "
                "GROUP BY r.partition",
                (PIPELINE, TOPIC, DONE),
            )
            return {int(p): int(u) for p, u in cur.fetchall()}
    finally:
        conn.close()


def show(rows: list[dict]) -> str:
    return ", ".join(f"#{b['batch_id']} {b['status']} {b['records']} rec {b['executors']} exec" for b in rows)


def fail_on_failed(rows: list[dict]) -> None:
    failed = [b for b in rows if b["status"] == "failed"]
    if failed:
        raise CheckFailed(f"batch {failed[0]['batch_id']} failed: {failed[0]['error']}")


def wait_batches(args: argparse.Namespace) -> None:
    """At least --min succeeded batches with records, on more than one executor count."""
    deadline = time.monotonic() + args.timeout
    last = None
    while True:
        rows = batches(args)
        if show(rows) != last:
            last = show(rows)
            log(f"batches: {last or 'none yet'}")
        fail_on_failed(rows)
        done = [b for b in rows if b["status"] in DONE and b["records"]]
        if len(done) >= args.min and len({b["executors"] for b in done}) > 1:
            log(f"{len(done)} batches with records succeeded, executors {[b['executors'] for b in done]}")
            return
        if time.monotonic() > deadline:
            raise CheckFailed(
                f"after {args.timeout:.0f} s: {len(done)} of {args.min} batches with records succeeded, "
                f"executors seen {sorted({b['executors'] for b in done})} (need a change)"
            )
        time.sleep(5)


def wait_in_spark(args: argparse.Namespace) -> None:
    """Wait until a batch is running and its Spark application is on the master (its executors
    are reading Kafka, or about to), and write its batch id to --write-to."""
    import requests

    deadline = time.monotonic() + args.timeout
    while True:
        rows = batches(args)
        fail_on_failed(rows)
        active = {
            a["name"] for a in requests.get(f"{args.spark_ui}/json/", timeout=30).json().get("activeapps", [])
        }
        for b in rows:
            if b["status"] == "running" and f"kbp-{PIPELINE}-batch-{b['batch_id']}" in active:
                log(f"batch {b['batch_id']} is running in Spark")
                with open(args.write_to, "w") as f:
                    f.write(str(b["batch_id"]))
                return
        if time.monotonic() > deadline:
            raise CheckFailed(f"after {args.timeout:.0f} s no batch was running in Spark: {show(rows)}")
        time.sleep(0.5)


def wait_finished(args: argparse.Namespace) -> None:
    """Wait until batch --batch has finished: succeeded, or failed and then replayed."""
    deadline = time.monotonic() + args.timeout
    seen: list[str] = []
    while True:
        row = next((b for b in batches(args) if b["batch_id"] == args.batch), None)
        status = row["status"] if row else "absent"
        if not seen or seen[-1] != status:
            seen.append(status)
            log(f"batch {args.batch}: {status}" + (f" ({row['error']})" if row and row["error"] else ""))
        if status in DONE:
            log(f"batch {args.batch} finished: {' -> '.join(seen)}")
            return
        if status == "abandoned" or time.monotonic() > deadline:
            raise CheckFailed(
                f"batch {args.batch} did not finish within {args.timeout:.0f} s: {' -> '.join(seen)}"
            )
        time.sleep(2)


def kafka_python_config(path: str | None) -> dict:
    """kafka-python arguments for a file of librdkafka-style properties (by hand: this script uses
    nothing of the provider)."""
    if not path:
        return {}
    with open(path) as f:
        props = json.load(f)
    names = {
        "bootstrap.servers": "bootstrap_servers",
        "security.protocol": "security_protocol",
        "sasl.mechanism": "sasl_mechanism",
        "sasl.username": "sasl_plain_username",
        "sasl.password": "sasl_plain_password",
        "ssl.ca.location": "ssl_cafile",
    }
    unknown = sorted(set(props) - set(names))
    if unknown:
        raise CheckFailed(f"{path}: properties this check does not know: {unknown}")
    return {names[k]: v for k, v in props.items()}


def replication(args: argparse.Namespace) -> None:
    """Every partition of the topic and of the group offsets' topic has 3 replicas, all in sync
    (waits up to --timeout for a restarted broker to catch up)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(
        client_id="kbp-docker-check",
        **{"bootstrap_servers": args.kafka, **kafka_python_config(args.properties_file)},
    )
    deadline = time.monotonic() + args.timeout
    try:
        while True:
            topics = admin.describe_topics([TOPIC, "__consumer_offsets"])
            short = {
                (t["name"], p["partition_index"]): (len(p["replica_nodes"]), len(p["isr_nodes"]))
                for t in topics
                for p in t["partitions"]
                if len(p["replica_nodes"]) != 3 or len(p["isr_nodes"]) != 3
            }
            counts = {t["name"]: len(t["partitions"]) for t in topics}
            if not short and all(counts.values()):
                log(f"replication: every partition of {counts} has 3 replicas, 3 in sync")
                return
            if time.monotonic() > deadline:
                raise CheckFailed(
                    f"partitions without 3 replicas in sync after {args.timeout:.0f} s "
                    f"((topic, partition): (replicas, in sync)): {dict(list(short.items())[:10])}; partitions {counts}"
                )
            time.sleep(2)
    finally:
        admin.close()


def end_offsets(args: argparse.Namespace) -> None:
    """Print the topic's end offsets as JSON {partition: offset}."""
    from kafka import KafkaConsumer, TopicPartition

    config = {"bootstrap_servers": args.kafka, **kafka_python_config(args.properties_file)}
    consumer = KafkaConsumer(client_id="kbp-docker-check", **config)
    try:
        parts = consumer.partitions_for_topic(TOPIC) or set()
        if not parts:
            raise CheckFailed(f"topic {TOPIC} has no partitions on {config['bootstrap_servers']}")
        ends = consumer.end_offsets([TopicPartition(TOPIC, p) for p in parts])
        print(json.dumps({tp.partition: int(o) for tp, o in ends.items()}))
    finally:
        consumer.close()


def wait_caught_up(args: argparse.Namespace) -> None:
    """Every record in the topic is in a finished batch, no batch is in flight, and at least
    --min-batches batches with records succeeded."""
    ends = {int(p): int(o) for p, o in json.loads(args.end_offsets).items()}
    log(f"end offsets of {TOPIC}: {dict(sorted(ends.items()))} ({sum(ends.values())} records)")
    deadline = time.monotonic() + args.timeout
    while True:
        rows = batches(args)
        if not args.replays:
            fail_on_failed(rows)
        heads = range_heads(args)
        open_batches = [b["batch_id"] for b in rows if b["status"] not in DONE]
        behind = {p: e - heads.get(p, 0) for p, e in ends.items() if heads.get(p, 0) < e}
        with_records = [b for b in rows if b["status"] in DONE and b["records"]]
        if not behind and not open_batches and len(with_records) >= args.min_batches:
            log(f"caught up after {len(with_records)} batches with records: {show(rows)}")
            return
        if time.monotonic() > deadline:
            raise CheckFailed(
                f"not caught up after {args.timeout:.0f} s: behind {behind}, open batches {open_batches}, "
                f"{len(with_records)} of {args.min_batches} batches with records"
            )
        time.sleep(5)


def airflow_session(args: argparse.Namespace):
    """A requests session carrying the admin's bearer token (POST /auth/token)."""
    import requests

    s = requests.Session()
    token = s.post(
        f"{args.airflow}/auth/token", json={"username": "admin", "password": args.password}, timeout=30
    )
    if token.status_code not in (200, 201):
        raise CheckFailed(f"POST /auth/token: HTTP {token.status_code}: {token.text[:200]}")
    s.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
    return s


def unthrottle(args: argparse.Namespace) -> None:
    """Edit the settings Variable as a user would in the UI: backpressure off, so the next batches
    read up to the latest offsets and the pipeline catches up whatever this machine's speed."""
    s = airflow_session(args)
    key = f"kbp.{PIPELINE}.settings"
    settings = json.loads(airflow_get(args, s, f"/api/v2/variables/{key}").json()["value"])
    settings["backpressure_enabled"] = False
    r = s.patch(
        f"{args.airflow}/api/v2/variables/{key}", json={"key": key, "value": json.dumps(settings)}, timeout=30
    )
    if r.status_code != 200:
        raise CheckFailed(f"PATCH /api/v2/variables/{key}: HTTP {r.status_code}: {r.text[:300]}")
    log(f"Variable {key}: backpressure_enabled = false")


def airflow_get(args: argparse.Namespace, session, path: str):
    r = session.get(args.airflow + path, timeout=30)
    if r.status_code != 200:
        raise CheckFailed(f"GET {path}: HTTP {r.status_code}: {r.text[:300]}")
    return r


def _redactor(secret: str):
    """A function that replaces ``secret`` in a text with ``***``."""
    return lambda text: text.replace(secret, "***") if secret else text


def _grpc_code(e: Exception) -> str:
    code = getattr(e, "getGrpcStatusCode", lambda: None)()
    if code is not None:
        return getattr(code, "name", str(code))
    found = re.search(r"StatusCode\.([A-Z_]+)", str(e))
    return found.group(1) if found else type(e).__name__


def _count_range(url: str) -> int:
    """spark.range(3).count() through a new Spark Connect session to ``url``; the session is released
    either way (a client left open retries for minutes at exit)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).create()
    try:
        return int(spark.range(3).count())
    finally:
        try:
            spark.stop()
        except Exception:  # noqa: BLE001 - a refused session cannot be released either
            pass


def connect_auth(args: argparse.Namespace) -> None:
    """The Connect server as the spark_connect_default connection reaches it: over TLS (the proxy's
    certificate names the host and verifies against GRPC_DEFAULT_SSL_ROOTS_FILE_PATH), refusing a
    client without the token and one with a wrong token (UNAUTHENTICATED), running a query for the
    connection's URL (token, use_ssl)."""
    import secrets
    import socket
    import ssl
    from urllib.parse import urlparse

    os.environ["_AIRFLOW_PROCESS_CONTEXT"] = "server"  # the hook reads the connection from the DB
    os.environ.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)  # pyspark's client would send it
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    url = SparkConnectHook(args.conn_id).get_connection_url()
    base, _, query = url.partition("/;")
    params = dict(p.split("=", 1) for p in query.split(";") if "=" in p)
    clean = _redactor(params.get("token", ""))
    shown = clean(url)
    if not params.get("token"):
        raise CheckFailed(f"connection {args.conn_id} ({shown}) has no password (the Connect server's token)")
    if params.get("use_ssl", "").lower() != "true":
        raise CheckFailed(f'connection {args.conn_id} ({shown}) lacks the extra {{"use_ssl": true}}')
    try:
        where = urlparse(base.replace("sc://", "https://", 1))
        host, port = where.hostname or "", int(where.port or 15002)
        roots = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "")
        if not roots:
            raise CheckFailed(
                "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH is not set: gRPC would not trust the stack's CA"
            )
        context = ssl.create_default_context(cafile=roots)
        context.set_alpn_protocols(["h2"])
        with socket.create_connection((host, port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                version, alpn = tls.version(), tls.selected_alpn_protocol()
        if alpn != "h2":
            raise CheckFailed(f"{host}:{port} negotiated {alpn!r}, not HTTP/2 (h2): no gRPC over it")
        log(f"TLS: {host}:{port} has a certificate for {host} signed by {roots} ({version}, ALPN {alpn})")
        refused = {
            "without a token": f"{base}/;use_ssl=true",
            "with a wrong token": f"{base}/;use_ssl=true;token={secrets.token_urlsafe(32)}",
        }
        for label, other in refused.items():
            try:
                n = _count_range(other)
            except Exception as e:  # noqa: BLE001 - the refusal is the expected outcome
                code = _grpc_code(e)
                details = re.search(r'details = "([^"]*)"', str(e))
                if code != "UNAUTHENTICATED":
                    raise CheckFailed(
                        f"a client {label}: expected UNAUTHENTICATED, got {code}: {clean(str(e))[:300]}"
                    ) from None
                log(f"a client {label} over TLS is refused: {code} ({details.group(1) if details else ''})")
            else:
                raise CheckFailed(f"a client {label} ran a query on the Connect server (count {n})")
        started = time.monotonic()
        n = _count_range(url)
        if n != 3:
            raise CheckFailed(f"spark.range(3).count() through {shown} returned {n}")
        log(
            f"connection {args.conn_id} ({shown}): spark.range(3).count() = 3 in {time.monotonic() - started:.1f} s"
        )
    except CheckFailed as e:
        raise CheckFailed(clean(str(e))) from None
    except Exception as e:  # noqa: BLE001 - reported without a traceback, the token taken out
        raise CheckFailed(f"{clean(type(e).__name__ + ': ' + str(e))[:500]}") from None


def add_endpoints(p: argparse.ArgumentParser) -> None:
    """The stack's endpoints as options (defaults: this machine's hostnet.env) and the admin's password."""
    p.add_argument("--postgres", default="postgresql://airflow:airflow@127.0.0.1:27432/kbp")
    p.add_argument("--airflow", default="http://127.0.0.1:27880")
    p.add_argument("--spark-ui", default="http://127.0.0.1:27080")
    p.add_argument(
        "--password",
        default=os.environ.get("AIRFLOW_ADMIN_PASSWORD", ""),
        help="the Airflow admin's password (default: env AIRFLOW_ADMIN_PASSWORD)",
    )


def command_parser(doc: str | None) -> tuple[argparse.ArgumentParser, Any]:
    """A check script's parser: the stack's endpoints as options, its commands as subparsers."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_endpoints(p)
    return p, p.add_subparsers(dest="command", required=True)


def main(argv: list[str] | None = None) -> int:
    p, sub = command_parser(__doc__)
    p.add_argument(
        "--kafka", default="127.0.0.1:27092", help="bootstrap servers, unless --properties-file has them"
    )
    p.add_argument("--properties-file", default=None, help="Kafka client properties (JSON, librdkafka-style)")
    w = sub.add_parser("wait-batches")
    w.add_argument("--min", type=int, default=3)
    w.add_argument("--timeout", type=float, default=900)
    r = sub.add_parser("wait-in-spark")
    r.add_argument("--write-to", required=True, help="file to write the batch id to")
    r.add_argument("--timeout", type=float, default=900)
    f = sub.add_parser("wait-finished")
    f.add_argument("--batch", type=int, required=True)
    f.add_argument("--timeout", type=float, default=900)
    sub.add_parser("unthrottle")
    sub.add_parser("end-offsets")
    rp = sub.add_parser("replication")
    rp.add_argument("--timeout", type=float, default=120)
    c = sub.add_parser("wait-caught-up")
    c.add_argument("--end-offsets", required=True, help="JSON {partition: end offset}, from end-offsets")
    c.add_argument("--min-batches", type=int, default=3, help="batches with records needed in all")
    c.add_argument("--timeout", type=float, default=600)
    c.add_argument(
        "--replays",
        action="store_true",
        help="a failed batch is not a failure while the replay DAG may still replay it (a fault was injected)",
    )
    ca = sub.add_parser("connect-auth")
    ca.add_argument("--conn-id", default="spark_connect_default")
    return dispatch(
        {
            "wait-batches": wait_batches,
            "wait-in-spark": wait_in_spark,
            "wait-finished": wait_finished,
            "replication": replication,
            "unthrottle": unthrottle,
            "end-offsets": end_offsets,
            "wait-caught-up": wait_caught_up,
            "connect-auth": connect_auth,
        },
        p.parse_args(argv),
    )


def dispatch(commands: dict, args: argparse.Namespace) -> int:
    """Run ``args.command``'s check: exit status 0 when it holds, else 1 with its message."""
    try:
        commands[args.command](args)
    except CheckFailed as e:
        print(f"check FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
