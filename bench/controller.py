"""The controller bench: every shipped simulator scenario under both modes, in one table.

The figures are deterministic outputs of the queue model (fixed seeds), not wall times: they say
how each mode sizes batches against the same arrivals and capacity. For each scenario the table
shows the issue's criteria for the cost mode (with Spark's mode's value beside it) and which mode
did better on the scenario's headline figure; then a seed sweep of the noise scenario, since its
criteria sit close to what any controller can reach with unpredictable (iid) noise.

    .venv/bin/python bench/controller.py                       # table only
    .venv/bin/python bench/controller.py --svg docs/controller-bench.svg

Exit status 1 when a criterion fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from airflow_kafka_backpressure.config import parse_settings
from airflow_kafka_backpressure.control.controller import COST, SPARK
from airflow_kafka_backpressure.control.plot import render_svg
from airflow_kafka_backpressure.control.scenarios import HEADLINES, Criterion, criteria, noise_90, shipped
from airflow_kafka_backpressure.control.simulate import Figures, simulate

SWEEP_SEEDS = range(1, 11)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "inf"
    if abs(v) < 10:
        return f"{v:.3f}"
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--svg", help="write the plot of the scenarios here (e.g. docs/controller-bench.svg)")
    args = p.parse_args(argv)

    started = time.perf_counter()
    settings = {mode: parse_settings({"mode": mode}) for mode in (SPARK, COST)}
    judged = criteria()
    runs = {name: {mode: simulate(sc, settings[mode]) for mode in (SPARK, COST)} for name, sc in shipped().items()}

    print(f"machine: {machine()}")
    print("criteria and headline figures (cost mode judged; Spark's mode shown for comparison)\n")
    head = f"{'scenario':<15} {'figure':<46} {'spark':>10} {'cost':>10} {'criterion':>10}  result"
    print(head)
    print("-" * len(head))
    failed = 0
    wins: dict[str, str] = {}
    for name, by_mode in runs.items():
        spark, cost = by_mode[SPARK].figures(), by_mode[COST].figures()
        for c in judged.get(name, ()):
            ok = c.passed(spark, cost)
            failed += not ok
            print(
                f"{name:<15} {c.label:<46} {fmt(_spark_value(c, spark)):>10} "
                f"{fmt(c.value(spark, cost)):>10} {c.describe():>10}  {'ok' if ok else 'FAILED'}"
            )
        label, headline = HEADLINES[name]
        s_h, c_h = headline(spark), headline(cost)
        wins[name] = "tie" if s_h == c_h else (COST if c_h < s_h else SPARK)
        print(f"{name:<15} {label + ' (headline)':<46} {fmt(s_h):>10} {fmt(c_h):>10} {'lower':>10}  better: {wins[name]}")

    print("\nall figures\n")
    head = (
        f"{'scenario':<15} {'mode':<5} {'batches':>7} {'over':>5} {'over%':>6} {'rec/s':>8} {'vs phys':>7} "
        f"{'drain':>6} {'phys':>6} {'final lag':>10} {'mean r':>6}  warning"
    )
    print(head)
    print("-" * len(head))
    for name, by_mode in runs.items():
        for mode, r in by_mode.items():
            f: Figures = r.figures()
            share = "-" if f.physical_throughput == 0 else f"{f.throughput_share:.1%}"
            print(
                f"{name:<15} {mode:<5} {f.batches:>7} {f.over_interval:>5} {f.over_share:>6.1%} {f.throughput:>8.1f} "
                f"{share:>7} {fmt(f.drain_batches):>6} {fmt(f.physical_drain):>6} {f.final_lag:>10,} "
                f"{f.mean_ratio:>6.2f}  {r.warning or ''}"
            )

    print(f"\nnoise-90 over seeds {SWEEP_SEEDS.start}-{SWEEP_SEEDS.stop - 1} (iid ±20%): cost mode's share over the interval, "
          "throughput / Spark mode's, Spark mode's share over")
    meeting = 0
    for seed in SWEEP_SEEDS:
        sc = noise_90("iid", seed)
        s, c = (simulate(sc, settings[m]).figures() for m in (SPARK, COST))
        both = all(cr.passed(s, c) for cr in judged["noise-90"])
        meeting += both
        print(f"  seed {seed:>2}: cost {c.over_share:6.1%}  {c.throughput / s.throughput:7.1%}   spark {s.over_share:6.1%}  {'meets both' if both else ''}")
    print(f"  {meeting} of {len(SWEEP_SEEDS)} seeds meet both criteria")

    print("\nbetter by headline: " + ", ".join(f"{n}: {w}" for n, w in wins.items()))
    if args.svg:
        rows = [(f"{name}: {shipped()[name].description}", list(by_mode.values())) for name, by_mode in runs.items()]
        Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
        Path(args.svg).write_text(render_svg(rows, target_ratio=settings[COST].target_ratio))
        print(f"plot: {args.svg}")
    print(f"bench time: {time.perf_counter() - started:.1f} s; criteria failed: {failed}")
    return 1 if failed else 0


def _spark_value(c: Criterion, spark: Figures) -> float | None:
    """Spark's mode's own value of the figure (the criterion's value with Spark in the cost seat)."""
    try:
        return c.value(spark, spark)
    except (TypeError, ZeroDivisionError):
        return None


if __name__ == "__main__":
    sys.exit(main())
