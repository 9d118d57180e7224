"""Per-batch ledger bookkeeping time as the history grows, measured in one run.

Writes batches through the real :class:`Ledger` API, each with one 10-offset range on each of
``--partitions`` partitions: ``record_plan`` → ``mark_running`` → ``mark_succeeded``, then ``heads`` and
``committable_offsets`` (what the plan and record tasks do per batch). When the history reaches each
checkpoint it times ``--samples`` more batches and prints the median wall time per step and in total,
and the median CPU time of this process per batch (SQLite works in-process, so on a shared machine
the CPU time is the steadier figure), then the ratios of the last checkpoint to the first. Flat
bookkeeping means ratios near 1. ``--profile`` adds where a batch's time goes at the last checkpoint:
each kind of statement (wall time from the driver's call to its return: the server's work, the
round trip and the driver) and the time outside them. Goal (issue 44): the whole bookkeeping of a
batch < 0.5 s at 10,000 partitions, on SQLite and PostgreSQL.

    .venv/bin/python bench/ledger_growth.py                       # 100 partitions, 1 … 10,000 batches
    .venv/bin/python bench/ledger_growth.py --partitions 1000 --checkpoints 1,100,1000
    .venv/bin/python bench/ledger_growth.py --url postgresql+psycopg2://…   # an empty database
    .venv/bin/python bench/ledger_growth.py --partitions 10000 --checkpoints 1,10,100 --profile

The default size writes 1M range rows in a few minutes on a 2-core machine; 1,000 partitions ×
10,000 batches (10M rows) takes about half an hour there, so it is opt-in.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import event

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]
PIPELINE, TOPIC, WIDTH = "bench", "events", 10
STEPS = ("plan", "transitions", "heads", "committable")
GOAL_MS, GOAL_PARTITIONS = 500, 10_000


def one_batch(led: Ledger, partitions: int, i: int) -> dict[str, float]:
    """Write batch ``i`` through the API; wall seconds per step, and this process's CPU seconds."""
    ranges = [OffsetRange(TOPIC, n, WIDTH * i, WIDTH * (i + 1)) for n in range(partitions)]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    batch_id = led.record_plan(PIPELINE, f"run-{i}", ranges, "/sink", 60_000, 0).batch_id
    t1 = time.perf_counter()
    led.mark_running(batch_id)
    led.mark_succeeded(batch_id, WIDTH * partitions, 1)
    t2 = time.perf_counter()
    heads = led.heads(PIPELINE)
    t3 = time.perf_counter()
    commit = led.committable_offsets(PIPELINE)
    t4 = time.perf_counter()
    cpu = time.process_time() - cpu0
    end = WIDTH * (i + 1)
    assert len(heads) == partitions and all(h == end for h in heads.values()), "heads are wrong"
    assert len(commit) == partitions and all(c == end for c in commit.values()), "commits are wrong"
    return {"plan": t1 - t0, "transitions": t2 - t1, "heads": t3 - t2, "committable": t4 - t3, "cpu": cpu}


class StatementTimes:
    """Wall time of each statement the ledger sends, by its first words and table (``--profile``)."""

    def __init__(self, led: Ledger) -> None:
        self.engine = led.engine
        self.times: dict[str, list[float]] = {}
        event.listen(self.engine, "before_cursor_execute", self._before)
        event.listen(self.engine, "after_cursor_execute", self._after)

    def _before(self, conn, cursor, statement, parameters, context, executemany) -> None:
        conn.info["bench_t0"] = time.perf_counter()

    def _after(self, conn, cursor, statement, parameters, context, executemany) -> None:
        elapsed = time.perf_counter() - conn.info.pop("bench_t0")
        words = statement.split()
        table = re.search(r"\bkbp_[a-z_]+", statement)
        kind = "WITH RECURSIVE" if words[:2] == ["WITH", "RECURSIVE"] else words[0]
        self.times.setdefault(f"{kind} {table[0] if table else ''}".strip(), []).append(elapsed)

    def stop(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._before)
        event.remove(self.engine, "after_cursor_execute", self._after)

    def report(self, batches: int, total_s: float) -> str:
        lines = [f"where a batch's time went at the last checkpoint (mean of {batches} batches):"]
        in_db = 0.0
        for name, times in sorted(self.times.items(), key=lambda kv: -sum(kv[1])):
            in_db += sum(times)
            lines.append(
                f"  {name:<32} {len(times) / batches:>5.1f} statements {sum(times) / batches * 1000:>8.1f} ms"
            )
        lines.append(
            f"  {'the rest':<32} {'':>16} {(total_s - in_db) / batches * 1000:>8.1f} ms"
            " (this process: building rows and plans, SQLAlchemy, fetching rows: SQLite reads them then)"
        )
        return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--checkpoints", default="1,100,1000,10000", help="history sizes (batches) to time at")
    ap.add_argument("--samples", type=int, default=9, help="batches timed at each checkpoint (median)")
    ap.add_argument("--url", help="an empty database (default: a new SQLite file under .tmp/)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="and, at the last checkpoint, where a batch's time goes: each kind of statement, and the rest",
    )
    args = ap.parse_args()
    checkpoints = sorted({int(x) for x in args.checkpoints.split(",")})
    if checkpoints[0] < 1:
        ap.error("--checkpoints must be >= 1")

    work = None
    url = args.url
    if url is None:
        (REPO / ".tmp").mkdir(exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="bench-ledger-", dir=REPO / ".tmp"))
        url = f"sqlite:///{work / 'ledger.db'}"
    led = Ledger(url)
    try:
        led.upgrade()
        print(
            f"ledger {led.url}; {args.partitions} partitions, {WIDTH} offsets per range, "
            f"median of {args.samples} batches per checkpoint"
        )
        print(
            f"{'history':>9} "
            + " ".join(f"{s + ' ms':>15}" for s in STEPS)
            + f" {'total ms':>10} {'CPU ms':>8}"
        )
        written, totals, cpus, started = 0, [], [], time.monotonic()
        for checkpoint in checkpoints:
            while written < checkpoint - 1:  # history before the timed batches
                one_batch(led, args.partitions, written)
                written += 1
            samples = []
            watch = StatementTimes(led) if args.profile and checkpoint == checkpoints[-1] else None
            for _ in range(args.samples):
                samples.append(one_batch(led, args.partitions, written))
                written += 1
            if watch is not None:
                watch.stop()
            median = {s: statistics.median(x[s] for x in samples) * 1000 for s in STEPS}
            total = statistics.median(sum(x[s] for s in STEPS) for x in samples) * 1000
            cpu = statistics.median(x["cpu"] for x in samples) * 1000
            totals.append(total)
            cpus.append(cpu)
            print(
                f"{checkpoint:>9} "
                + " ".join(f"{median[s]:>15.1f}" for s in STEPS)
                + f" {total:>10.1f} {cpu:>8.1f}",
                flush=True,
            )
            if watch is not None:
                profile = watch.report(args.samples, sum(sum(x[s] for s in STEPS) for x in samples))
        if args.profile:
            print(profile)
        for first in checkpoints[: min(2, len(checkpoints) - 1)]:  # the 1st is an almost empty database
            k = checkpoints.index(first)
            print(
                f"ratio at {checkpoints[-1]} / at {first} batches: total {totals[-1] / totals[k]:.2f}, "
                f"CPU {cpus[-1] / cpus[k]:.2f}"
            )
        verdicts = ", ".join(
            f"{'met' if total < GOAL_MS else 'NOT met'} at {c}" for c, total in zip(checkpoints, totals)
        )
        scope = "" if args.partitions == GOAL_PARTITIONS else f"; this run has {args.partitions} partitions"
        print(
            f"goal (issue 44, at {GOAL_PARTITIONS:,} partitions{scope}): a batch's whole bookkeeping "
            f"< {GOAL_MS} ms: {verdicts} batches of history"
        )
        print(
            f"({written} batches, {written * args.partitions} ranges written in {time.monotonic() - started:.0f} s)"
        )
    finally:
        led.dispose()
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
