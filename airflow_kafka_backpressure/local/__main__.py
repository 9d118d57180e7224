"""Command line for the embedded defaults.

    python -m airflow_kafka_backpressure.local broker [--port 19092]
    python -m airflow_kafka_backpressure.local spark-connect [--port 15002] [--master local[2]] [--work-dir DIR]
    python -m airflow_kafka_backpressure.local produce --bootstrap 127.0.0.1:19092 --topic demo-events \\
        --partitions 4 [--count N | --rate R]

``broker`` runs in the foreground until SIGTERM/SIGINT and prints its bootstrap address once it
answers metadata. ``spark-connect`` does the same for a Spark Connect server (the connect engine's
``spark_connect`` connection: host ``sc://127.0.0.1``, the printed port).
``produce`` creates the topic if needed and writes demo records with unique ids.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

from .broker import TansuBroker
from .producer import ensure_topic, produce
from .spark_connect import SparkConnectServer


def _serve(server: TansuBroker | SparkConnectServer, listening: Callable[[], str], exited: str) -> int:
    """Start ``server``, print ``listening()`` once it answers, run until SIGTERM/SIGINT (exit 0)
    or until its process exits (print ``exited``, exit 1); stop it either way."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(listening(), flush=True)
    try:
        while not stop.wait(1.0):
            if server.process is None or server.process.poll() is not None:
                print(exited, file=sys.stderr)
                return 1
    finally:
        server.stop()
    return 0


def _broker(args: argparse.Namespace) -> int:
    broker = TansuBroker(port=args.port, log_path=args.log)
    return _serve(
        broker,
        lambda: f"Kafka-protocol broker (Tansu) listening on {broker.bootstrap}, pid {broker.pid}",
        "broker process exited",
    )


def _spark_connect(args: argparse.Namespace) -> int:
    server = SparkConnectServer(args.work_dir, port=args.port, master=args.master)
    return _serve(
        server,
        lambda: f"Spark Connect server listening on {server.url} (master {server.master}), pid {server.pid}",
        f"Spark Connect server exited; see {server.log_path}",
    )


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
    print(f"produced {sent} records to {args.topic} (ids {args.start_id}..{args.start_id + sent - 1})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_kafka_backpressure.local")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("broker", help="run the embedded Tansu broker on 127.0.0.1")
    b.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    b.add_argument("--log", default=None, help="append the broker's output to this file")
    b.set_defaults(func=_broker)
    c = sub.add_parser("spark-connect", help="run a Spark Connect server on 127.0.0.1 (from the installed pyspark)")
    c.add_argument("--port", type=int, default=None, help="gRPC port (default: a free one)")
    c.add_argument("--master", default="local[2]", help="Spark master of the server (default local[2])")
    c.add_argument("--work-dir", default="kbp-spark-connect", help="scratch directory and log (spark-connect.log)")
    c.set_defaults(func=_spark_connect)
    p = sub.add_parser("produce", help="write demo records with unique ids")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--count", type=int, default=None, help="records to write (default: until stopped)")
    p.add_argument("--rate", type=float, default=None, help="records per second (default: as fast as possible)")
    p.add_argument("--start-id", type=int, default=0)
    p.add_argument("--payload-bytes", type=int, default=64)
    p.set_defaults(func=_produce)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
