"""Soak: one pipeline under a real ``airflow standalone``, real Spark (spark-submit, local[2]), the
embedded broker and a PostgreSQL ledger, for N batches with random faults; then the sink is read back.

    PYTHONPATH=. .venv/bin/python bench/soak.py --batches 200 --fault-rate 0.1

A producer writes records all along. Each time a batch's Spark driver starts, a fault is injected
with probability ``--fault-rate``, its kind drawn from ``--kinds``:

* ``driver_kill``  SIGKILL of the Spark driver JVM mid-batch;
* ``swap_kill``    SIGKILL of the Airflow task process after the batch's sink swap, before the ledger
  marked it (the test-only pause point of ``airflow_kafka_backpressure.batch.fault_points``);
* ``broker_freeze`` the broker SIGSTOPped for ``--freeze-s`` seconds (longer than the timeouts);
* ``ledger_outage`` the ledger's PostgreSQL stopped for ``--outage-s`` seconds, then restarted;
* ``cleared_run``  an earlier, finished ingest run cleared (re-run) through the REST API;
* ``backfill``     ``airflow backfill create`` over two intervals an hour ago.

At the end the producer stops and the pipeline is given ``--recover-timeout-s`` to hold every
produced record exactly once. Printed: batches, faults by kind, records produced / written / lost /
duplicated / missing, batches stuck, time to recover after each fault (until every batch that
existed when it was injected was finished) and after the end. Exit status 1 unless 0 missing,
0 duplicated, 0 stuck.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_kafka_backpressure.config.pipeline import PipelineConfig  # noqa: E402
from airflow_kafka_backpressure.ledger import Ledger  # noqa: E402
from kbp_local.apache_kafka import KafkaBroker  # noqa: E402
from kbp_local.jars import spark_kafka_conf, write_spark_defaults  # noqa: E402
from kbp_local.producer import ensure_topic, produce  # noqa: E402
from tests.faults.harness import HarnessError, Standalone, check_pipeline, wait_for, wait_until_consistent  # noqa: E402
from tests.faults.pause_point import PAUSE_DIR_ENV as PAUSE_AFTER_COMMIT_DIR_ENV  # noqa: E402
from tests.fixtures_postgres import LocalPostgres  # noqa: E402

KINDS = ("driver_kill", "swap_kill", "broker_freeze", "ledger_outage", "cleared_run", "backfill")
FINISHED = ("succeeded", "replayed", "abandoned")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--batches", type=int, default=10, help="stop producing after this many batches (ledger rows)"
    )
    ap.add_argument("--fault-rate", type=float, default=0.1, help="probability of a fault per batch")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, among {','.join(KINDS)}")
    ap.add_argument("--rate", type=float, default=10.0, help="records/s produced")
    ap.add_argument("--interval-s", type=float, default=15.0, help="batch interval")
    ap.add_argument("--freeze-s", type=float, default=40.0)
    ap.add_argument("--outage-s", type=float, default=25.0)
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop producing after this long even if fewer batches ran (the report says how many)",
    )
    ap.add_argument("--recover-timeout-s", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--work-dir", default=str(REPO / ".tmp" / f"soak-{os.getpid()}"))
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown fault kind(s) {unknown}; use some of {','.join(KINDS)}")
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)

    root = Path(args.work_dir)
    root.mkdir(parents=True, exist_ok=False)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Spark's Kafka connector for every spark-submit of the pipeline (the native reader)
    write_spark_defaults(root / "spark-conf", spark_kafka_conf())
    os.environ["SPARK_CONF_DIR"] = str(root / "spark-conf")
    broker = KafkaBroker(root / "kafka").start()
    postgres = LocalPostgres(root / "pg")
    standalone = None
    stop_producing = threading.Event()
    produced = [0]
    try:
        ledger_url = postgres.start()
        p = PipelineConfig(
            name="soak",
            topics=("soak-events",),
            sink=str(root / "sink"),
            ledger_conn_id="kbp_ledger_soak",
            batch_interval_s=args.interval_s,
            replay_interval_s=args.interval_s * 4 / 3,
            lease_s=20,
            stall_timeout_s=20,
            batch_timeout_s=480,
            driver_memory="512m",
        )
        ensure_topic(broker.bootstrap, p.topics[0], 2)
        pause_dir = root / "pause"
        pause_dir.mkdir()
        from tests.faults.conftest import SETTINGS, connections

        standalone = Standalone(
            root / "airflow",
            [p],
            connections(broker.bootstrap, {"kbp_ledger_soak": ledger_url}),
            extra_env={PAUSE_AFTER_COMMIT_DIR_ENV: str(pause_dir), "SPARK_LOCAL_DIRS": str(root / "spark")},
        ).start()
        standalone.set_variable(p.settings_variable, SETTINGS)
        ledger = Ledger(ledger_url)

        def producer() -> None:
            while not stop_producing.is_set():
                try:
                    produced[0] += produce(
                        broker.bootstrap,
                        p.topics[0],
                        count=int(args.rate),
                        partitions=2,
                        start_id=produced[0],
                    )
                except Exception as e:  # noqa: BLE001 - the broker is frozen (an injected fault): try again
                    print(f"producer: {type(e).__name__}: {e}; retrying", flush=True)
                stop_producing.wait(1.0)

        threading.Thread(target=producer, daemon=True).start()
        for d in (p.ingest_dag_id, p.replay_dag_id):
            standalone.set_paused(d, False)

        faults: Counter = Counter()
        pending: list[tuple[str, float, set[int]]] = []  # (kind, injected at, batches to finish)
        recoveries: dict[str, list[float]] = {}
        seen_apps: set[int] = set()
        started = time.monotonic()

        def batches() -> list:
            try:
                return ledger.recent_batches(p.name, 100_000)
            except Exception:  # noqa: BLE001 - the ledger may be down (an injected outage)
                return []

        def settle_pending() -> None:
            if not pending:
                return
            status = {b.batch_id: b.status for b in batches()}
            if not status:
                return
            for item in list(pending):
                kind, at, ids = item
                if all(status.get(i) in FINISHED for i in ids):
                    recoveries.setdefault(kind, []).append(time.monotonic() - at)
                    pending.remove(item)

        app = f"kbp-{p.name}-batch-"
        deadline = None if args.max_minutes is None else started + args.max_minutes * 60
        while len(batches()) < args.batches and (deadline is None or time.monotonic() < deadline):
            settle_pending()
            drivers = [d for d in standalone.spark_drivers(app) if d.pid not in seen_apps]
            if not drivers:
                time.sleep(0.5)
                continue
            driver = drivers[0]
            seen_apps.add(driver.pid)
            if rng.random() >= args.fault_rate:
                continue
            kind = rng.choice(kinds)
            before = {b.batch_id for b in batches() if b.status not in FINISHED}
            at = time.monotonic()
            try:
                inject(
                    kind,
                    driver=driver,
                    standalone=standalone,
                    broker=broker,
                    postgres=postgres,
                    p=p,
                    ledger=ledger,
                    pause_dir=pause_dir,
                    args=args,
                    rng=rng,
                )
            except HarnessError as e:
                print(f"[{time.monotonic() - started:6.0f}s] fault {kind} not injected: {e}", flush=True)
                continue
            faults[kind] += 1
            ids = before | {b.batch_id for b in batches() if b.status not in FINISHED}
            pending.append((kind, at, ids))
            print(
                f"[{time.monotonic() - started:6.0f}s] injected {kind} (batches {len(batches())})", flush=True
            )

        stop_producing.set()
        time.sleep(1.5)
        end_at = time.monotonic()
        try:
            outcome, took = wait_until_consistent(
                standalone, p, ledger_url, broker.bootstrap, args.recover_timeout_s
            )
        except HarnessError as e:
            print(f"NOT RECOVERED: {e}", flush=True)
            outcome, took = check_pipeline(p, ledger_url, broker.bootstrap), time.monotonic() - end_at
        settle_pending()
        total_s = time.monotonic() - started
        all_batches = batches()
        rec = [t for ts in recoveries.values() for t in ts]
        report = {
            "machine": f"{platform.node()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}",
            "seed": seed,
            "batches": len(all_batches),
            "batch_statuses": dict(Counter(b.status for b in all_batches)),
            "faults": dict(faults),
            "records_produced": outcome.produced,
            "records_written": outcome.written,
            "records_lost": len(outcome.lost),
            "records_duplicated": len(outcome.duplicated),
            "records_missing": len(outcome.missing),
            "group_short": outcome.committed_short,
            "stuck_batches": outcome.stuck,
            "recover_after_fault_s": {k: [round(t) for t in v] for k, v in recoveries.items()},
            "recover_after_fault_median_s": round(statistics.median(rec)) if rec else None,
            "recover_after_fault_max_s": round(max(rec)) if rec else None,
            "unrecovered_faults": [k for k, _, _ in pending],
            "recover_at_end_s": round(took),
            "wall_s": round(total_s),
            "stopped_by": "batches" if len(all_batches) >= args.batches else "max-minutes",
        }
        print(json.dumps(report, indent=2), flush=True)
        ok = outcome.ok and not pending
        print("OK" if ok else "FAILED", flush=True)
        ledger.dispose()
        return 0 if ok else 1
    finally:
        stop_producing.set()
        if standalone is not None:
            standalone.stop()
        broker.stop()
        postgres.stop()


def inject(
    kind: str,
    *,
    driver,
    standalone: Standalone,
    broker: KafkaBroker,
    postgres: LocalPostgres,
    p: PipelineConfig,
    ledger: Ledger,
    pause_dir: Path,
    args,
    rng: random.Random,
) -> None:
    if kind == "driver_kill":
        time.sleep(rng.uniform(1, 5))
        try:
            driver.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            raise HarnessError("the driver ended before the kill") from None
    elif kind == "swap_kill":
        (pause_dir / f"{p.name}.arm").touch()
        paused = pause_dir / f"{p.name}.paused"
        try:
            wait_for("a batch paused after its sink commit", paused.exists, 300, every_s=0.3)
        finally:
            (pause_dir / f"{p.name}.arm").unlink(missing_ok=True)
        pid, _ = (int(x) for x in paused.read_text().split())
        paused.unlink()
        os.kill(pid, signal.SIGKILL)
    elif kind == "broker_freeze":
        time.sleep(rng.uniform(0, 3))
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            time.sleep(args.freeze_s)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
    elif kind == "ledger_outage":
        time.sleep(rng.uniform(0, 3))
        postgres.shutdown()
        try:
            time.sleep(args.outage_s)
        finally:
            postgres.restart()
    elif kind == "cleared_run":
        done = [b for b in ledger.recent_batches(p.name, 50, ["succeeded"]) if b.records]
        if not done:
            raise HarnessError("no finished batch to clear yet")
        standalone.clear_run(p.ingest_dag_id, rng.choice(done).run_id)
    elif kind == "backfill":
        start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(
            hours=1, seconds=rng.randrange(3600)
        )
        r = standalone.airflow(
            "backfill",
            "create",
            "--dag-id",
            p.ingest_dag_id,
            "--from-date",
            start.isoformat(),
            "--to-date",
            (start + timedelta(seconds=p.batch_interval_s)).isoformat(),
        )
        if r.returncode != 0:
            raise HarnessError(f"backfill refused: {(r.stdout + r.stderr).strip()[-300:]}")
    else:  # pragma: no cover - checked by the argument parser
        raise ValueError(kind)


if __name__ == "__main__":
    sys.exit(main())
