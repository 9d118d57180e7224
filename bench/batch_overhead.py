"""Per-batch cost of the two batch engines, measured in one run on one machine.

Starts an embedded broker and a local Spark Connect server (``local[2]``, warmed with one batch, as
a deployment keeps it running), produces a 100-record topic and a 100,000-record topic (4
partitions each), then runs batches through :class:`~airflow_kafka_backpressure.hooks.spark_batch.SparkBatchHook`
the way the ingest operator does:

* every batch runs in a **fresh Python process** (an Airflow task process): ``SparkBatchHook.run``
  is timed inside it, so the connect engine pays its client import and a new Connect session per
  batch, and the submit engine a new ``spark-submit`` application per batch;
* ``submit`` — ``spark-submit --master local[2]`` through the Spark provider's hook, URI hand-off;
* ``connect`` — a session to the warm server, the package shipped as session artifacts;
* ``bare spark-submit`` — a no-op Python script through ``spark-submit`` (the floor of the submit
  engine: JVM, Python and SparkContext start-up).

Prints, per line, the median of ``--repeat`` batches of 100 records (seconds per batch) and one
batch of 100,000 records (records/s, wall time of ``run``), then the ratios connect/submit. Goals of
issue #7: per-batch ≤ 0.25×, throughput ≥ 1.0×.

    .venv/bin/python bench/batch_overhead.py               # ~4-6 minutes on 2 cores
    .venv/bin/python bench/batch_overhead.py --repeat 5 --big 200000
    .venv/bin/python bench/batch_overhead.py --profile     # and where the last small batches' time went
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


def one_batch(args: argparse.Namespace) -> None:
    """Child mode: run one batch through the hook in this (fresh) process; print its timings."""
    from airflow_kafka_backpressure.batch.models import BatchPlan, OffsetRange
    from airflow_kafka_backpressure.config.pipeline import PipelineConfig
    from airflow_kafka_backpressure.hooks.spark_batch import SparkBatchHook

    ranges = tuple(OffsetRange(args.topic, p, 0, args.per_partition) for p in range(args.partitions))
    plan = BatchPlan(
        "bench", args.batch_id, f"bench-{args.batch_id}", ranges, args.sink, 60_000, int(time.time() * 1000)
    )
    pipeline = PipelineConfig(
        name="bench",
        topics=(args.topic,),
        sink=args.sink,
        engine=args.engine,
        reader=args.reader,
        batch_timeout_s=1800,
        sink_format=args.sink_format,
        spark_conf=json.loads(args.spark_conf),
    )
    hook = SparkBatchHook(pipeline)
    profile_to = os.environ.get("KBP_BENCH_PROFILE")
    if profile_to:  # --profile: where the batch's time goes, in this process (the server's is apart)
        import cProfile
        import threading

        profiler = cProfile.Profile()
        profiler.enable()
        thread_profilers: list[cProfile.Profile] = []

        def profile_thread(*_: object) -> None:  # the engine runs the batch in a thread of its own
            thread_profilers.append(cProfile.Profile())
            thread_profilers[-1].enable()

        threading.setprofile(profile_thread)
    t0 = time.monotonic()
    metrics = hook.run(plan, 1, {"bootstrap.servers": args.bootstrap})
    wall = time.monotonic() - t0
    if profile_to:
        import pstats

        profiler.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
        stats = pstats.Stats(profiler)
        for p in thread_profilers:
            p.disable()
            stats.add(p)
        stats.dump_stats(profile_to)
    if metrics.records != plan.records:
        raise SystemExit(f"batch {args.batch_id}: {metrics.records} records, expected {plan.records}")
    print(
        "KBP_BENCH "
        + json.dumps(
            {
                "wall_s": wall,
                "records": metrics.records,
                "processing_ms": metrics.processing_ms,
                "startup_ms": metrics.startup_ms,
            }
        )
    )


def print_profile(path: Path, top: int = 30) -> None:
    """The ``top`` calls of one batch's process by cumulative time (cProfile; wall time, so waits
    on the server count where they happen)."""
    import pstats

    print(f"\nwhere one {path.stem} batch's time goes in its task process (cProfile, cumulative):")
    pstats.Stats(str(path)).strip_dirs().sort_stats("cumulative").print_stats(top)


def marked_result(out: subprocess.CompletedProcess[str], mark: str, what: str) -> dict[str, Any]:
    """The JSON a child printed after ``mark`` on a line of its own; exits naming ``what`` with the
    child's output when there is none (the child failed)."""
    for line in out.stdout.splitlines():
        if line.startswith(mark):
            return json.loads(line[len(mark) :])
    raise SystemExit(f"{what} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")


def run_child(env: dict[str, str], *argv: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--one", *argv], env=env, capture_output=True, text=True, timeout=1800
    )
    return marked_result(out, "KBP_BENCH ", f"batch ({' '.join(argv)})")


def task_env(work: Path) -> dict[str, str]:
    """The environment of a batch's task process (:func:`run_child`) under ``work``: spark-submit's
    defaults, Spark's Kafka connector in a spark-defaults file (a Connect server gets it from its
    own settings), Airflow on a scratch SQLite database with ``spark_default`` (``local[2]``, client
    mode), and this checkout on the path."""
    from airflow_kafka_backpressure.engines.environment import spark_submit_env
    from kbp_local.jars import spark_kafka_conf, write_spark_defaults

    env = dict(os.environ)
    env.update(spark_submit_env(work / "submit-env"))
    write_spark_defaults(work / "spark-conf", spark_kafka_conf())
    env["SPARK_CONF_DIR"] = str(work / "spark-conf")
    env.update(
        AIRFLOW_HOME=str(work / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{work / 'airflow.db'}",
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps(
            {
                "conn_type": "spark",
                "host": "local[2]",
                "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
            }
        ),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    return env


def bare_spark_submit(env: dict[str, str], work: Path) -> float:
    from airflow_kafka_backpressure.engines.environment import spark_conf_defaults

    script = work / "noop.py"
    script.write_text("from pyspark.sql import SparkSession\nSparkSession.builder.getOrCreate().stop()\n")
    cmd = ["spark-submit", "--master", "local[2]"]
    for k, v in spark_conf_defaults(work / "noop").items():
        cmd += ["--conf", f"{k}={v}"]
    t0 = time.monotonic()
    subprocess.run([*cmd, str(script)], env=env, check=True, capture_output=True, timeout=600)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="100-record batches per line (median)")
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--big", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile the last small batch of each engine (cProfile) and print it",
    )
    ap.add_argument("--engine")
    ap.add_argument("--topic")
    ap.add_argument("--per-partition", type=int)
    ap.add_argument("--batch-id", type=int)
    ap.add_argument("--sink")
    ap.add_argument("--sink-format", default="parquet", help=argparse.SUPPRESS)
    ap.add_argument("--spark-conf", default="{}", help=argparse.SUPPRESS)  # JSON: the pipeline's spark_conf
    ap.add_argument("--bootstrap")
    ap.add_argument(
        "--reader", default="auto", help="auto (Spark's Kafka connector is on both engines: native) or python"
    )
    args = ap.parse_args()
    if args.one:
        return one_batch(args)

    from reader_throughput import produce_records

    from kbp_local.apache_kafka import KafkaBroker
    from kbp_local.jars import spark_kafka_conf
    from kbp_local.producer import ensure_topic
    from kbp_local.spark_connect import SparkConnectServer

    tmp_root = REPO / ".tmp"
    tmp_root.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-", dir=tmp_root))
    env = task_env(work)
    load_before = os.getloadavg()[0]
    small: dict[str, list[float]] = {}
    big: dict[str, dict] = {}
    try:
        with (
            KafkaBroker(work / "kafka") as broker,
            SparkConnectServer(work / "connect", conf=spark_kafka_conf()) as server,
        ):
            host, _, port = server.url.rpartition(":")
            env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = json.dumps(
                {"conn_type": "spark_connect", "host": host, "port": int(port)}
            )
            p = args.partitions
            for topic, count in (("small", args.small), ("big", args.big)):
                ensure_topic(broker.bootstrap, topic, p)
                produce_records(broker.bootstrap, topic, count, p, 100)
            print(f"broker, Connect server, {args.small} + {args.big} records ready", flush=True)
            batch_ids = iter(range(1, 10_000))

            def batch(engine: str, topic: str, count: int, profile: Path | None = None) -> dict:
                return run_child(
                    {**env, "KBP_BENCH_PROFILE": str(profile)} if profile else env,
                    "--engine",
                    engine,
                    "--topic",
                    topic,
                    "--per-partition",
                    str(count // p),
                    "--partitions",
                    str(p),
                    "--batch-id",
                    str(next(batch_ids)),
                    "--sink",
                    str(work / f"sink-{engine}"),
                    "--bootstrap",
                    broker.bootstrap,
                )

            warm = batch("connect", "small", args.small)  # the server's first batch: workers, registration
            print(f"  connect warm-up batch                {warm['wall_s']:6.2f} s", flush=True)
            small["bare spark-submit"] = []
            for i in range(args.repeat):  # interleaved: every line meets the same background load
                for engine in ("submit", "connect"):
                    profile = tmp_root / f"{engine}.prof" if args.profile and i == args.repeat - 1 else None
                    r = batch(engine, "small", args.small, profile)
                    small.setdefault(engine, []).append(r["wall_s"])
                    print(f"  {engine:8s} {args.small:>7} records      {r['wall_s']:6.2f} s", flush=True)
                t = bare_spark_submit(env, work)
                small["bare spark-submit"].append(t)
                print(f"  bare spark-submit                    {t:6.2f} s", flush=True)
            for engine in ("submit", "connect"):
                big[engine] = r = batch(engine, "big", args.big)
                print(f"  {engine:8s} {args.big:>7} records      {r['wall_s']:6.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in small.items()}
    rate = {k: v["records"] / v["wall_s"] for k, v in big.items()}
    print(
        f"\nbatch engines, one run: median of {args.repeat} x {args.small}-record batches, one {args.big}-record batch, "
        f"{p} partitions, local[2]; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
        f"({os.cpu_count()} CPUs)"
    )
    print(f"  {'':20s} {'s/batch (' + str(args.small) + ')':>16s} {'records/s (' + str(args.big) + ')':>22s}")
    for k in ("submit", "connect", "bare spark-submit"):
        thr = f"{rate[k]:>22,.0f}" if k in rate else f"{'-':>22s}"
        print(f"  {k:20s} {med[k]:>16.2f} {thr}")
    print(f"  connect/submit per batch   {med['connect'] / med['submit']:.2f}x   (goal <= 0.25x)")
    print(f"  connect/submit throughput  {rate['connect'] / rate['submit']:.2f}x   (goal >= 1.0x)")
    if args.profile:
        for engine in ("connect", "submit"):
            print_profile(tmp_root / f"{engine}.prof")


if __name__ == "__main__":
    main()
