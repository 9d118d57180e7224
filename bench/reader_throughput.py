"""Records/s of the Kafka range reader, measured in one run against one confluent-kafka consumer.

Starts Apache Kafka (KRaft, one node: :mod:`kbp_local.apache_kafka`),
produces ``--records`` records (default 1,000,000) over ``--partitions`` partitions in record
batches of up to ``--records-per-batch`` (default 1,000, as a batching producer writes them), then
reads the same ranges several ways and prints records/s and the ratio to the first line:

* ``confluent consumer`` — one confluent-kafka consumer assigned every range, records counted in
  a plain loop (the baseline: what one process with librdkafka does; same fetch settings as the
  reader);
* ``kafka-python consumer`` — the same with kafka-python;
* ``read_range (<client>)`` — the reader's per-partition function in plain Python, one range after
  the other, Arrow batches built (what each Spark task does, without Spark);
* ``read_range (confluent), 2 processes`` — the same in two worker processes at once, one range
  per task, as ``local[2]`` runs the Data Source;
* ``data source confluent (first query)`` — the Data Source in a fresh local[N] session, rows sent
  to Spark's ``noop`` sink (read cost only), Python workers and data source planning started cold;
* ``data source <client> (warm)`` — the same once the session's Python workers run;
* ``data source confluent -> parquet`` — the same read into Spark's Parquet writer with the sink's
  settings (``sinks.parquet.write.PLAIN_COLUMNS``; one directory, overwritten): the read + write stage alone;
  the line below it uses Spark's defaults (a dictionary tried on every column);
* ``spark kafka source -> noop`` — Spark's own reader (``format("kafka")``, the connector's jars
  from the jar cache, its DataSource V2 scan as the job reads) into the ``noop`` sink: its read cost
  alone;
* ``job native read + parquet`` — the whole batch as a pipeline without a transform runs it by
  default where the connector is on the classpath: ``spark.job.run_batch(spark, spec)`` (bounds
  check, Spark's reader, Spark's Parquet writer counting the records as they pass, the sink's fence,
  commit, manifest read-back), a new fenced attempt at the same batch each time;
* ``job python read + parquet, writer=arrow`` — the same batch with the Python reader (clusters
  without the connector), whose tasks write the range they read with pyarrow
  (:mod:`airflow_kafka_backpressure.spark.arrow_writer`), the records never entering the JVM;
* ``job python read + parquet, writer=spark`` — the Python reader into Spark's Parquet writer (what
  a pipeline with a transform and no connector uses).

The goal: ``job native read + parquet`` >= 1.0x ``confluent consumer`` on 1,000,000 batched
records. ``--repeat N`` (default 5)
runs every line N times; lines run interleaved, round after round, and the load average is printed
with the results, because it moves them. Two figures per line:

* best of N (other processes on a shared machine only ever slow a run down); every line gets
  exactly N timed runs, so no line's best is drawn from more samples than another's;
* for the job lines, "paired": each of their runs comes right after a consumer run of its own
  (not counted in the consumer's best-of), and the median of those N ratios is printed: adjacent
  runs share the broker's and the machine's state, two bests need not. The last line says whether
  the goal is met, by the paired median (see :func:`run_lines`).

``--cpu`` (Linux) prints after each timed run where its CPU went, in cores (:mod:`cpu_use`): the
machine, the Spark JVM (its executor task threads, JIT compiler, garbage collector, the rest), the
broker and this process (the consumer lines run in it).

Before the timed rounds, ``--warmup N`` (default 1) rounds run every line once, uncounted: a
session's first runs of a line pay its JIT and Python worker start-up.

    .venv/bin/python bench/reader_throughput.py                        # 1,000,000 records, 4 partitions, 5 rounds
    .venv/bin/python bench/reader_throughput.py --records-per-batch 1  # one record per Kafka batch
    .venv/bin/python bench/reader_throughput.py --master 'local[1]'    # one Spark core vs one consumer
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_use  # noqa: E402 - bench/ is not a package

from airflow_kafka_backpressure.batch.models import BatchPlan, JobSpec, OffsetRange
from airflow_kafka_backpressure.engines.environment import spark_conf_defaults, spark_submit_env
from kbp_local.apache_kafka import KafkaBroker
from kbp_local.jars import spark_kafka_conf
from kbp_local.producer import demo_record, ensure_topic

REPO = Path(__file__).resolve().parents[1]


def produce_records(
    bootstrap: str, topic: str, count: int, partitions: int, payload_bytes: int, records_per_batch: int = 1000
) -> None:
    """The demo's records (id ``i`` to partition ``i % partitions``) with confluent-kafka (much
    faster than the demo producer), up to ``records_per_batch`` records per Kafka record batch (a
    real producer batches: ``linger.ms``, ``batch.size``)."""
    from confluent_kafka import Producer

    def producer(per_batch: int) -> Any:
        return Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 0 if per_batch == 1 else 50,
                "batch.num.messages": per_batch,
                "batch.size": 64 * 1024 * 1024,
                "acks": "all",
            }
        )

    def send(p: Any, ids: range) -> None:
        for i in ids:
            key, value = demo_record(i, payload_bytes)
            while True:
                try:
                    p.produce(topic, key=key, value=value, partition=i % partitions)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    p.poll(0.1)
            p.poll(0)
        if p.flush(60):
            raise SystemExit("the producer could not deliver every record within 60 s")

    send(producer(records_per_batch), range(count))


def confluent_consumer(bootstrap: str, ranges: list[OffsetRange]) -> int:
    """One confluent-kafka consumer over all ranges; counts the records inside them. It gets the
    reader's fetch settings, so the ratios show the reader's and Spark's cost, not tuning."""
    from confluent_kafka import Consumer, TopicPartition

    from airflow_kafka_backpressure.spark.range_clients import CONFLUENT_FETCH_DEFAULTS

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kbp-bench",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            **CONFLUENT_FETCH_DEFAULTS,
        }
    )
    until = {r.partition: r.until_offset for r in ranges}
    c.assign([TopicPartition(r.topic, r.partition, r.from_offset) for r in ranges])
    tps = [TopicPartition(r.topic, r.partition) for r in ranges]
    n = 0
    try:
        while any(p.offset < until[p.partition] for p in c.position(tps)):
            for m in c.consume(num_messages=10_000, timeout=0.1):
                if m.error() is None and m.offset() < until[m.partition()]:
                    n += 1
    finally:
        c.close()
    return n


def reader_clients(args: argparse.Namespace) -> tuple[str, ...]:
    """The Kafka clients of the reader lines (``--no-kafka-python``: confluent-kafka only)."""
    return ("confluent",) if args.no_kafka_python else ("confluent", "kafka-python")


def kafka_python_consumer(bootstrap: str, ranges: list[OffsetRange]) -> int:
    """One kafka-python consumer over all ranges; counts the records inside them."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, max_poll_records=10_000
    )
    until = {TopicPartition(r.topic, r.partition): r.until_offset for r in ranges}
    c.assign(list(until))
    for r in ranges:
        c.seek(TopicPartition(r.topic, r.partition), r.from_offset)
    n = 0
    try:
        while any(c.position(tp) < u for tp, u in until.items()):
            for tp, records in c.poll(timeout_ms=1000, max_records=10_000).items():
                n += sum(1 for rec in records if rec.offset < until[tp])
    finally:
        c.close()
    return n


def read_range_loop(client: str, batch: int) -> Callable[[str, list[OffsetRange]], int]:
    def run(bootstrap: str, ranges: list[OffsetRange]) -> int:
        from airflow_kafka_backpressure.spark.range_reader import read_range

        props = {"bootstrap.servers": bootstrap}
        return sum(
            b.num_rows
            for r in ranges
            for b in read_range(r, props, client=client, max_records_per_batch=batch)
        )

    return run


def _read_one(args: tuple[str, OffsetRange]) -> int:
    from airflow_kafka_backpressure.spark.range_reader import read_range

    bootstrap, r = args
    return sum(b.num_rows for b in read_range(r, {"bootstrap.servers": bootstrap}, client="confluent"))


@contextlib.contextmanager
def concurrent_readers(processes: int) -> Iterator[Callable[[str, list[OffsetRange]], int]]:
    """``read_range`` in ``processes`` worker processes at once, one range per task (as Spark's
    ``local[N]`` runs the Data Source's partitions), the workers started before the clock runs."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(abs, range(processes)))  # start the workers

        def run(bootstrap: str, ranges: list[OffsetRange]) -> int:
            return sum(pool.map(_read_one, [(bootstrap, r) for r in ranges]))

        yield run


Line = tuple[str, Callable[[], int]]
BASELINE = "confluent consumer"
#: Lines measured right after a run of the baseline of their own (see :func:`run_lines`).
PAIRED = (
    "job native read + parquet",
    "job python read + parquet, writer=arrow",
    "job python read + parquet, writer=spark",
)


def run_lines(
    results: dict[str, float] | None,
    paired: dict[str, list[float]],
    total: int,
    lines: list[Line],
    rounds: int,
) -> None:
    """Every line once per round, round after round, keeping each line's best: lines interleaved
    meet the same background load, so their ratios hold better on a shared machine.

    The lines of :data:`PAIRED` (the whole job) also get a run of the baseline just before each of
    their runs, and ``paired[line]`` collects each run's ratio to that baseline run (why: the module
    doc); that baseline run does not count toward the baseline's best. With ``results=None``
    (warm-up rounds) nothing is kept."""
    baseline = dict(lines).get(BASELINE)
    for _ in range(rounds):
        for label, fn in lines:
            if label in PAIRED and baseline is not None:
                base_rate = _timed(None, total, f"{BASELINE} (paired)", baseline)
                ratio = _timed(results, total, label, fn) / base_rate
                if results is not None:
                    paired.setdefault(label, []).append(ratio)
            else:
                _timed(results, total, label, fn)


def warm_up(paired: dict[str, list[float]], total: int, lines: list[Line], rounds: int) -> None:
    if rounds:
        print(f"warm-up ({rounds} round(s), not counted):", flush=True)
        run_lines(None, paired, total, lines, rounds)
        print("timed rounds:", flush=True)


#: With ``--cpu``: the processes whose CPU each timed run reports (name -> pid; see :mod:`cpu_use`).
CPU_PROCESSES: dict[str, int | None] | None = None


def _timed(results: dict[str, float] | None, total: int, label: str, fn: Callable[[], int]) -> float:
    """One timed run of ``fn``; its rate counts toward ``results[label]`` (the line's best) unless
    ``results`` is None (a paired baseline run, which only serves the ratio of the run after it)."""
    procs = CPU_PROCESSES
    before = cpu_use.snapshot(procs, threads_of="spark") if procs is not None else None
    t0 = time.monotonic()
    n = fn()
    elapsed = time.monotonic() - t0
    if procs is not None and before is not None:
        used = cpu_use.cores(before, cpu_use.snapshot(procs, threads_of="spark"), elapsed)
        print(f"    cpu, {label.strip()}: {cpu_use.describe(used)}", flush=True)
    if n != total:
        raise SystemExit(f"{label}: read {n} records, expected {total}")
    if results is not None:
        results[label] = max(results.get(label, 0.0), total / elapsed)
    print(f"  {label:38s} {total / elapsed:>10,.0f} rec/s  ({elapsed:.2f}s)", flush=True)
    return total / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument(
        "--records-per-batch",
        type=int,
        default=1000,
        help="records per Kafka record batch when producing (at most; a real producer batches)",
    )
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--max-records-per-batch", type=int, default=None, help="Arrow batch rows (reader default)"
    )
    ap.add_argument("--max-records-per-partition", type=int, default=None, help="split size (reader default)")
    ap.add_argument("--min-partitions", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5, help="rounds over all lines; each line's best is kept")
    ap.add_argument(
        "--warmup", type=int, default=1, help="uncounted rounds over all lines before the timed ones"
    )
    ap.add_argument("--cpu", action="store_true", help="print where each timed run's CPU went (Linux /proc)")
    ap.add_argument("--skip-spark", action="store_true", help="only the plain-Python lines")
    ap.add_argument(
        "--no-kafka-python",
        action="store_true",
        help="leave out the kafka-python lines (~30x slower than confluent-kafka on batched records: minutes per round at 10^6)",
    )
    args = ap.parse_args()

    from airflow_kafka_backpressure.spark.range_clients import confluent_available
    from airflow_kafka_backpressure.spark.range_reader import DEFAULT_ARROW_BATCH_ROWS

    if not confluent_available():
        raise SystemExit(
            "the baseline needs confluent-kafka: pip install -c constraints.txt -e '.[confluent]'"
        )
    batch = args.max_records_per_batch or DEFAULT_ARROW_BATCH_ROWS
    clients = reader_clients(args)
    tmp_root = REPO / ".tmp"
    tmp_root.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-reader-", dir=tmp_root))
    os.environ.update(spark_submit_env(work))
    results: dict[str, float] = {}
    paired: dict[str, list[float]] = {}
    load_before = os.getloadavg()[0]
    try:
        with KafkaBroker(work / "kafka", heap="1g") as broker:
            global CPU_PROCESSES
            if args.cpu:
                CPU_PROCESSES = {"broker": broker.pid}
            topic = "bench"
            ensure_topic(broker.bootstrap, topic, args.partitions)
            t0 = time.monotonic()
            produce_records(
                broker.bootstrap,
                topic,
                args.records,
                args.partitions,
                args.payload_bytes,
                args.records_per_batch,
            )
            print(f"produced {args.records} records in {time.monotonic() - t0:.1f}s", flush=True)
            per = args.records // args.partitions
            ranges = [OffsetRange(topic, p, 0, per) for p in range(args.partitions)]
            total = per * args.partitions
            bootstrap = broker.bootstrap

            lines: list[Line] = [
                (BASELINE, lambda: confluent_consumer(bootstrap, ranges)),
            ]
            if not args.no_kafka_python:
                lines.append(("kafka-python consumer", lambda: kafka_python_consumer(bootstrap, ranges)))
            for client in clients:
                fn = read_range_loop(client, batch)
                lines.append((f"read_range ({client})", lambda fn=fn: fn(bootstrap, ranges)))
            with concurrent_readers(2) as pair:
                lines.append(("read_range (confluent), 2 processes", lambda: pair(bootstrap, ranges)))
                if args.skip_spark:
                    warm_up(paired, total, lines, args.warmup)
                    run_lines(results, paired, total, lines, args.repeat)
                else:
                    with spark_session(args.master, work) as spark:
                        if CPU_PROCESSES is not None:  # pyspark's gateway process execs the JVM
                            CPU_PROCESSES["spark"] = spark.sparkContext._gateway.proc.pid
                        first, spark_lines = spark_reads(spark, args, work, bootstrap, ranges, total)
                        run_lines(results, paired, total, [first], 1)
                        warm_up(paired, total, lines + spark_lines, args.warmup)
                        run_lines(results, paired, total, lines + spark_lines, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = results[BASELINE]
    print(
        f"\n{total} records, {args.partitions} partitions, {args.payload_bytes}-byte payloads, "
        f"{args.records_per_batch} record(s) per Kafka batch, {args.master}, "
        f"best of {args.repeat} after {args.warmup} warm-up round(s); load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
        f"({os.cpu_count()} CPUs)"
    )
    for label, rate in results.items():
        line = f"  {label:38s} {rate:>10,.0f} rec/s   ratio {rate / base:.2f}"
        if label in paired:
            ratios = sorted(paired[label])
            line += f"   paired with the run before: median {statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
        print(line)
    job = paired.get(PAIRED[0])
    if job:
        median, goal = statistics.median(job), 1.0
        print(
            f"goal: {PAIRED[0]} >= {goal}x {BASELINE} (paired median of {len(job)}): {median:.2f}x, "
            f"{'met' if median >= goal else 'NOT met'}; best of {args.repeat}: {results[PAIRED[0]] / base:.2f}x"
        )


@contextlib.contextmanager
def spark_session(master: str, work: Path) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("kbp-bench")
    for k, v in spark_conf_defaults(work, spark_kafka_conf()).items():  # with Spark's Kafka connector
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


def spark_reads(
    spark: Any, args: argparse.Namespace, work: Path, bootstrap: str, ranges: list[OffsetRange], total: int
) -> tuple[Line, list[Line]]:
    """The first Data Source query of the session, and the warm Spark lines."""
    from airflow_kafka_backpressure.sinks import data_sources as registry
    from airflow_kafka_backpressure.sinks.parquet.write import plain_column_options
    from airflow_kafka_backpressure.spark.job import native_options, run_batch
    from airflow_kafka_backpressure.spark.kafka_range_source import (
        SOURCE_NAME,
        KafkaRangeDataSource,
        range_source_options,
    )
    from airflow_kafka_backpressure.spark.readers import read_kafka_through_v2

    registry.register(spark, KafkaRangeDataSource)
    clients = reader_clients(args)
    tuning: dict[str, Any] = {}
    if args.max_records_per_batch:
        tuning["max_records_per_batch"] = args.max_records_per_batch
    if args.max_records_per_partition is not None:
        tuning["max_records_per_partition"] = args.max_records_per_partition or None
    if args.min_partitions:
        tuning["min_partitions"] = args.min_partitions
    props = {"bootstrap.servers": bootstrap}

    def data_source(client: str) -> int:
        opts = range_source_options(ranges, props, client=client, **tuning)
        df = spark.read.format(SOURCE_NAME).options(**opts).load()
        df.write.format("noop").mode("overwrite").save()
        return total  # the noop sink returns no count; exactness is the tests' job

    plan = BatchPlan("bench", 0, "bench", tuple(ranges), str(work / "sink"), 1000, 0)
    options = {k: v for k, v in tuning.items() if k != "min_partitions"}
    if options.get("max_records_per_partition", 0) is None:
        options["max_records_per_partition"] = 0  # no limit

    attempts = itertools.count(1)

    def job(reader: str, writer: str) -> int:  # a new attempt each time (fenced): it replaces the same batch
        spec = JobSpec(
            plan=plan,
            kafka=props,
            launched_at_ms=0,
            min_partitions=tuning.get("min_partitions"),
            options={**options, "writer": writer},
            attempt=next(attempts),
            reader=reader,
        )
        return run_batch(spark, spec).records

    def native_noop() -> int:
        read_kafka_through_v2(spark)  # as the job reads (spark.readers.read_ranges)
        df = (
            spark.read.format("kafka")
            .options(**native_options(JobSpec(plan=plan, kafka=props, launched_at_ms=0)))
            .load()
        )
        df.write.format("noop").mode("overwrite").save()
        return total

    warm: list[Line] = [
        (f"data source {client} (warm)", lambda c=client: data_source(c)) for client in clients
    ]

    def data_source_parquet(plain_columns: tuple[str, ...] | None) -> int:
        opts = range_source_options(ranges, props, client="confluent", **tuning)
        df = spark.read.format(SOURCE_NAME).options(**opts).load()
        writer = df.write.mode("overwrite").options(**plain_column_options(df.columns, plain_columns))
        writer.parquet(str(work / "plain"))
        return total

    warm.append(("data source confluent -> parquet", lambda: data_source_parquet(None)))
    warm.append(("  the same, Spark's Parquet defaults", lambda: data_source_parquet(())))
    warm.append(("spark kafka source -> noop", native_noop))
    warm.append((PAIRED[0], lambda: job("native", "spark")))
    warm.append((PAIRED[1], lambda: job("python", "arrow")))
    warm.append((PAIRED[2], lambda: job("python", "spark")))
    return ("data source confluent (first query)", lambda: data_source("confluent")), warm


if __name__ == "__main__":
    main()
