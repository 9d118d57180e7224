"""The project's batch job against the peer users would schedule instead, paired in one run.

The peer: a Spark Structured Streaming query with ``trigger(availableNow=True)`` — Spark's own
Kafka source (``subscribe``, ``startingOffsets=earliest``, ``includeHeaders``) into the same sink
format with a checkpoint, run to the end of the topic and stopped, as a team would run it from an
Airflow task. The project: one batch of the same records through
:class:`~airflow_kafka_backpressure.hooks.spark_batch.SparkBatchHook`, as the ingest task runs it
(plan of every partition's whole range, bounds check, Spark's Kafka reader, the sink's fence, commit
and manifest). Both write Kafka's raw columns; both start from nothing each run (a new table, and a
new checkpoint for the peer), so each reads the whole topic.

Starts one broker (KRaft, :mod:`kbp_local.apache_kafka`) and one Spark Connect server (``local[2]``,
Spark's Kafka connector and Delta's jars, warmed with one batch, as a deployment keeps it), produces
two 4-partition topics of the demo's 100-byte records (``--small``, default 1,000, and ``--big``,
default 1,000,000) and runs, for each size and sink format (Parquet, Delta), four lines:

* ``project submit`` / ``peer submit`` — one ``spark-submit --master local[2]`` application each
  (the project's through the Spark provider's hook, in a fresh Python process as an Airflow task;
  the peer's as a script, timed from the parent: the JVM's and Python's start-up count on both);
* ``project connect`` / ``peer connect`` — a fresh Python process with a Spark Connect session to
  the warm server (Structured Streaming runs over Connect too), timed from before the session.

Lines run interleaved, project and peer back to back in alternating order, ``--repeat`` rounds
(default 3); each pair's ratio is taken within the pair (adjacent runs share the machine's state)
and the median printed. Goals (issue 44): the project's throughput >= 1.5x the peer's on
1,000,000 records; the connect engine's small batch <= 0.1x the peer's spark-submit run. Where each
side's time goes is printed from the last round: the project's start-up (launch to first record)
and processing (``BatchMetrics``), the peer's query phases (``StreamingQueryProgress.durationMs``,
summed over its micro-batches).

    .venv/bin/python bench/peer.py                      # ~15 minutes on 2 cores
    .venv/bin/python bench/peer.py --repeat 1 --big 100000 --formats parquet
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

GOAL_THROUGHPUT = 1.5  # project records/s over the peer's, 1,000,000 records
GOAL_SMALL = 0.1  # connect engine's small batch over the peer's spark-submit run


def peer_query(args: argparse.Namespace) -> None:
    """Child mode (``--query``): the peer's streaming query, to the end of the topic; prints its
    rows and phases. Run by spark-submit (no ``--remote``) or as a Connect client."""
    t0 = time.monotonic()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("kbp-bench-peer")
    spark = (builder.remote(args.remote) if args.remote else builder).getOrCreate()
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .writeStream.format(args.sink_format)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start(args.sink)
    )
    stream.awaitTermination()
    wall = time.monotonic() - t0
    progress = [json.loads(p.json) for p in stream.recentProgress]  # StreamingQueryProgress
    phases: dict[str, int] = {}
    for p in progress:
        for k, v in (p.get("durationMs") or {}).items():
            phases[k] = phases.get(k, 0) + int(v)
    rows = sum(int(s.get("numInputRows") or 0) for p in progress for s in p.get("sources") or ())
    print(
        "KBP_PEER "
        + json.dumps({"wall_s": wall, "records": rows, "phases": phases, "batches": len(progress)})
    )
    if not args.remote:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="paired rounds (median of the pairs' ratios)")
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--formats", default="parquet,delta", help="comma-separated: parquet, delta")
    ap.add_argument("--query", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--remote", "--bootstrap", "--topic", "--sink", "--sink-format", "--checkpoint"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.query:
        return peer_query(args)

    import batch_overhead
    from reader_throughput import produce_records

    from airflow_kafka_backpressure.engines.environment import spark_conf_defaults
    from kbp_local.apache_kafka import KafkaBroker
    from kbp_local.jars import combined_spark_conf, spark_delta_conf, spark_kafka_conf
    from kbp_local.producer import ensure_topic
    from kbp_local.spark_connect import SparkConnectServer

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    tmp_root = REPO / ".tmp"
    tmp_root.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-peer-", dir=tmp_root))
    env = batch_overhead.task_env(work)  # the connector in spark-defaults, for both sides
    # what each format adds to a spark-submit application (spark.jars given replaces the defaults')
    submit_conf = {
        "parquet": {},
        "delta": combined_spark_conf(spark_kafka_conf(), spark_delta_conf()),
    }
    p = args.partitions
    runs = iter(range(1, 100_000))
    times: dict[tuple[int, str, str, str], list[float]] = {}
    ratios: dict[tuple[int, str, str], list[float]] = {}
    last: dict[tuple[int, str, str, str], dict[str, Any]] = {}
    load_before = os.getloadavg()[0]

    def project(engine: str, topic: str, count: int, fmt: str, bootstrap: str) -> dict[str, Any]:
        n = next(runs)
        return batch_overhead.run_child(
            env,
            "--engine", engine,
            "--topic", topic,
            "--per-partition", str(count // p),
            "--partitions", str(p),
            "--batch-id", "1",
            "--sink", str(work / f"project-{n}"),
            "--sink-format", fmt,
            "--spark-conf", json.dumps(submit_conf[fmt] if engine == "submit" else {}),
            "--bootstrap", bootstrap,
        )  # fmt: skip

    def peer(engine: str, topic: str, count: int, fmt: str, bootstrap: str, remote: str) -> dict[str, Any]:
        n = next(runs)
        query = [
            __file__, "--query",
            "--bootstrap", bootstrap,
            "--topic", topic,
            "--sink", str(work / f"peer-{n}"),
            "--sink-format", fmt,
            "--checkpoint", str(work / f"peer-{n}-checkpoint"),
        ]  # fmt: skip
        if engine == "submit":
            cmd = ["spark-submit", "--master", "local[2]"]
            for k, v in {**spark_conf_defaults(work / f"peer-{n}-app"), **submit_conf[fmt]}.items():
                cmd += ["--conf", f"{k}={v}"]
            cmd += query
        else:
            cmd = [sys.executable, *query, "--remote", remote]
        t0 = time.monotonic()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - t0
        result = batch_overhead.marked_result(
            out, "KBP_PEER ", f"the peer ({engine}, {fmt}, {count} records)"
        )
        if result["records"] != count:
            raise SystemExit(f"the peer read {result} records of {count}:\n{out.stderr[-4000:]}")
        if engine == "submit":  # the whole application, as the project's submit line counts it
            result["wall_s"] = wall
        return result

    try:
        connect_conf = combined_spark_conf(spark_kafka_conf(), spark_delta_conf(jars="extraClassPath"))
        with (
            KafkaBroker(work / "kafka") as broker,
            SparkConnectServer(work / "connect", conf=connect_conf) as server,
        ):
            host, _, port = server.url.rpartition(":")
            env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
                {"conn_type": "spark_connect", "host": host, "port": int(port)}
            )
            sizes = (("small", args.small), ("big", args.big))
            for topic, count in sizes:
                ensure_topic(broker.bootstrap, topic, p)
                produce_records(broker.bootstrap, topic, count, p, 100)
            print(f"broker, Connect server, {args.small:,} + {args.big:,} records ready", flush=True)
            for fmt in formats:  # the server's first batch of each format and side: uncounted
                project("connect", "small", args.small, fmt, broker.bootstrap)
                peer("connect", "small", args.small, fmt, broker.bootstrap, server.url)
            for i in range(args.repeat):
                for topic, count in sizes:
                    for fmt in formats:
                        for engine in ("submit", "connect"):
                            sides = ["project", "peer"] if i % 2 == 0 else ["peer", "project"]
                            got: dict[str, dict[str, Any]] = {}
                            for side in sides:
                                if side == "project":
                                    got[side] = project(engine, topic, count, fmt, broker.bootstrap)
                                else:
                                    got[side] = peer(engine, topic, count, fmt, broker.bootstrap, server.url)
                                key = (count, fmt, engine, side)
                                times.setdefault(key, []).append(got[side]["wall_s"])
                                last[key] = got[side]
                                print(
                                    f"  round {i + 1} {count:>9,} {fmt:8s} {side:7s} {engine:8s} "
                                    f"{got[side]['wall_s']:7.2f} s",
                                    flush=True,
                                )
                            ratios.setdefault((count, fmt, engine), []).append(
                                got["peer"]["wall_s"] / got["project"]["wall_s"]
                            )
                    if count == args.small:  # the small-batch goal pairs connect with the peer's submit
                        for fmt in formats:
                            ratios.setdefault((count, fmt, "connect/peer submit"), []).append(
                                times[(count, fmt, "connect", "project")][-1]
                                / times[(count, fmt, "submit", "peer")][-1]
                            )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\nproject vs Structured Streaming availableNow, one run: {args.repeat} paired rounds, {p} partitions, "
        f"local[2], 100-byte records; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
        f"({os.cpu_count()} CPUs)"
    )
    print(
        f"  {'records':>9s} {'format':8s} {'engine':8s} {'project s':>10s} {'peer s':>8s} {'peer/project (paired median)':>30s}"
    )
    for count in (args.small, args.big):
        for fmt in formats:
            for engine in ("submit", "connect"):
                pt = statistics.median(times[(count, fmt, engine, "project")])
                qt = statistics.median(times[(count, fmt, engine, "peer")])
                r = statistics.median(ratios[(count, fmt, engine)])
                print(f"  {count:>9,} {fmt:8s} {engine:8s} {pt:>10.2f} {qt:>8.2f} {r:>29.2f}x")
    print("\ngoals (paired medians):")
    for fmt in formats:
        for engine in ("submit", "connect"):
            r = statistics.median(ratios[(args.big, fmt, engine)])
            verdict = "met" if r >= GOAL_THROUGHPUT else "not met"
            print(
                f"  {args.big:,} records, {fmt}, {engine}: project throughput {r:.2f}x the peer's "
                f"(goal >= {GOAL_THROUGHPUT}x): {verdict}"
            )
        r = statistics.median(ratios[(args.small, fmt, "connect/peer submit")])
        verdict = "met" if r <= GOAL_SMALL else "not met"
        print(
            f"  {args.small:,} records, {fmt}: connect batch {r:.2f}x the peer's spark-submit run "
            f"(goal <= {GOAL_SMALL}x): {verdict}"
        )
    print("\nwhere the time goes (last round, seconds):")
    for (count, fmt, engine, side), r in sorted(last.items()):
        if side == "project":
            detail = (
                f"start-up (launch to first record) {r['startup_ms'] / 1000:.2f}, "
                f"processing {r['processing_ms'] / 1000:.2f}"
            )
        else:
            phases = ", ".join(
                f"{k} {v / 1000:.2f}" for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1])
            )
            detail = f"{r['batches']} micro-batch(es): {phases}"
        print(f"  {count:>9,} {fmt:8s} {engine:8s} {side:7s} wall {r['wall_s']:.2f}; {detail}")


if __name__ == "__main__":
    main()
