"""Many pipelines on one deployment: do they all keep up, how fresh, and what the machine spends.

For each N of ``--counts`` (default 1,5,10,20,40), runs the demo (``bench/freshness.py``'s
:func:`~freshness.run_demo`: one broker, one Schema Registry, one Spark Connect server, one
``airflow standalone``) with N pipelines started together on live topics: the demo's pipeline and
N - 1 like it, one topic each, each topic written by its own producer at ``--rate`` Avro
records/s from the start (no backlog), default controller settings, the connect engine, a
``--interval`` of 60 s. A reader polls every sink. Prints per N:

* how many pipelines kept up (each of its last 3 batches holds no record older than two intervals);
* the oldest record of each batch (seconds from production to the batch's commit seen by the
  reader) from the ``--skip``-th batch on, p50 and p95 over every pipeline's batches;
* the latest batch (1-based) from which a pipeline's oldest record stays within interval + 10 s
  (issue 44's goal: within 3 batches), the worst pipeline's;
* the cores used over the run by the machine and by each group of processes (``/proc``,
  :data:`freshness.CPU_GROUPS`): Airflow's task processes (with the executor's workers that start
  them), the scheduler, the DAG processor, the API server, the triggerer, the Connect server, the
  broker, the producers, the registry, and the rest.

Goals (issue 44): 20 pipelines keep up with the oldest record of a batch <= interval + 10 s at
p95; a pipeline started on a live topic reaches that within 3 batches.

    .venv/bin/python bench/pipelines.py                                  # 1..40 pipelines, ~45 minutes
    .venv/bin/python bench/pipelines.py --counts 10 --minutes 6
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from freshness import CPU_GROUPS, batch_rows, percentile, run_demo  # noqa: E402 - bench/ is not a package

SLACK_S = 10.0  # goal: the oldest record of a batch within interval + 10 s
WITHIN_BATCHES = 3  # goal: reached by a pipeline's 3rd batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,5,10,20,40", help="comma-separated numbers of pipelines")
    ap.add_argument("--interval", type=int, default=60)
    ap.add_argument("--rate", type=int, default=20, help="records/s per topic")
    ap.add_argument("--minutes", type=float, default=8.0, help="how long each N runs once the demo is up")
    ap.add_argument("--skip", type=int, default=3, help="batches before this one not in the p50/p95")
    ap.add_argument("--parallelism", type=int, default=8, help="Airflow's core.parallelism (task slots)")
    ap.add_argument("--keep", action="store_true", help="keep each run's directory (logs, sinks)")
    args = ap.parse_args()

    results = []
    for n in (int(c) for c in args.counts.split(",") if c.strip()):
        run = run_demo(
            interval=args.interval,
            rate=args.rate,
            minutes=args.minutes,
            pipelines=n,
            parallelism=args.parallelism,
        )
        oldest: list[float] = []
        kept_up = 0
        reached: list[int | None] = []
        for name in run.sinks:
            worst = [max(ages) for _, ages, _, _ in batch_rows(run, name) if ages]
            oldest.extend(worst[args.skip :])
            if len(worst) >= 3 and all(w <= 2 * args.interval for w in worst[-3:]):
                kept_up += 1
            within = [w <= args.interval + SLACK_S for w in worst]
            first = next((i for i in range(len(within)) if all(within[i:])), None) if within else None
            reached.append(None if first is None else first + 1)
        results.append((n, kept_up, oldest, reached, run.cpu, run.load))
        line = (
            f"N={n}: {kept_up}/{n} kept up; oldest of a batch p50 "
            f"{percentile(oldest, 0.5) if oldest else float('nan'):.1f} s"
        )
        print(line, flush=True)
        if not args.keep:
            shutil.rmtree(run.work, ignore_errors=True)

    print(
        f"\nmany pipelines, one deployment: connect engine, {args.interval} s interval, {args.rate} records/s per topic, "
        f"{args.minutes:g} min each, core.parallelism {args.parallelism} ({os.cpu_count()} CPUs); oldest record of a "
        f"batch from batch {args.skip + 1} on, seconds"
    )
    print(
        f"  {'N':>3s} {'kept up':>8s} {'p50':>6s} {'p95':>6s} {'reached by batch (worst)':>25s} {'load after':>11s}"
    )
    for n, kept_up, oldest, reached, _, load in results:
        p50 = f"{percentile(oldest, 0.5):6.1f}" if oldest else f"{'-':>6s}"
        p95 = f"{percentile(oldest, 0.95):6.1f}" if oldest else f"{'-':>6s}"
        worst_reach = (
            "never" if any(r is None for r in reached) else str(max(r for r in reached if r is not None))
        )
        print(f"  {n:>3d} {kept_up:>4d}/{n:<3d} {p50} {p95} {worst_reach:>25s} {load[1]:11.1f}")
    names = [name for name, _ in CPU_GROUPS]
    print(
        "\ncores used over each run, by process group (a group's ended processes with the one that started them):"
    )
    print(
        f"  {'N':>3s} {'machine':>8s} "
        + " ".join(f"{name:>{max(len(name), 6)}s}" for name in names)
        + f" {'the rest':>9s}"
    )
    for n, _, _, _, cpu, _ in results:
        rest = cpu.get("machine", 0.0) - sum(cpu.get(name, 0.0) for name in names)
        print(
            f"  {n:>3d} {cpu.get('machine', 0.0):8.2f} "
            + " ".join(f"{cpu.get(name, 0.0):>{max(len(name), 6)}.2f}" for name in names)
            + f" {max(rest, 0.0):9.2f}"
        )
    print("\ngoals:")
    for n, kept_up, oldest, reached, _, _ in results:
        if not oldest:
            continue
        p95 = percentile(oldest, 0.95)
        ok_p95 = kept_up == n and p95 <= args.interval + SLACK_S
        reach_ok = all(r is not None and r <= WITHIN_BATCHES for r in reached)
        print(
            f"  N={n}: all keep up with the oldest record <= interval + {SLACK_S:g} s at p95 ({p95:.1f} s): "
            f"{'met' if ok_p95 else 'not met'}; each within {WITHIN_BATCHES} batches: {'met' if reach_ok else 'not met'}"
        )


if __name__ == "__main__":
    main()
