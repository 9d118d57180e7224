"""Command line of the controller simulator: ``python -m airflow_kafka_backpressure.sim``.

Examples::

    python -m airflow_kafka_backpressure.sim --list
    python -m airflow_kafka_backpressure.sim issue-drop noise-90 --svg .tmp/sim.svg
    python -m airflow_kafka_backpressure.sim burst --mode spark --set proportional=0.5 --set integral=0.1
    python -m airflow_kafka_backpressure.sim --from-ledger orders --ledger-url sqlite:///ledger.db
    python -m airflow_kafka_backpressure.sim --from-ledger orders --conn-id kbp_ledger

Settings are the keys of the settings Variable (``kbp.<pipeline>.settings``), given as a JSON object
(``--settings``) and/or ``--set key=value`` (the value is JSON: ``--set mode='"spark"'`` or simply
``--set mode=spark``). ``--from-ledger`` reads the pipeline's recorded batches, fits the cost model
and replays the recorded arrivals under each mode; the ledger is a SQLAlchemy URL, or an Airflow
connection resolved the way the pipeline resolves it (``--conn-id``, needs Airflow).

Only the ledger options touch anything outside this process; the simulation itself is pure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.config.settings import ControllerSettings, SettingsError, parse_settings
from airflow_kafka_backpressure.control.controller import MODES
from airflow_kafka_backpressure.sim.history import HistoryError, Recorded, scenario_from_history
from airflow_kafka_backpressure.sim.plot import render_svg
from airflow_kafka_backpressure.sim.scenarios import shipped
from airflow_kafka_backpressure.sim.simulate import Scenario, SimulationResult, simulate

DEFAULT_LEDGER_LIMIT = 500


def _parse_set(values: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SettingsError(f"--set {item!r}: expected key=value, e.g. --set integral=0.1")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw  # a bare word, e.g. mode=spark
    return out


def settings_for(mode: str, base: dict[str, Any]) -> ControllerSettings:
    return parse_settings({**base, "mode": mode}, source="simulator settings")


def ledger_url(args: argparse.Namespace) -> str:
    if args.ledger_url:
        return str(args.ledger_url)
    from airflow_kafka_backpressure.hooks.ledger import LedgerHook  # needs Airflow: only for --conn-id

    return LedgerHook(args.conn_id).url()


def ledger_scenario(args: argparse.Namespace) -> tuple[Scenario, Recorded, str]:
    from airflow_kafka_backpressure.ledger import Ledger  # SQLAlchemy: only for --from-ledger

    url = ledger_url(args)
    ledger = Ledger(url)
    try:
        batches = ledger.recent_batches(args.from_ledger, limit=args.limit)
        known = [] if batches else ledger.pipelines()
    finally:
        ledger.dispose()
    if not batches:
        raise HistoryError(
            f"pipeline {args.from_ledger!r} has no batches in the ledger at {url}; pipelines there: "
            f"{known or 'none'}"
        )
    scenario, fit, recorded = scenario_from_history(batches, args.from_ledger, seed=args.seed or 0)
    return scenario, recorded, f"fit: {json.dumps(fit.to_dict())}"


def figures_table(results: Sequence[SimulationResult]) -> str:
    """One line per run: the figures of :class:`~.sim.simulate.Figures`."""
    head = (
        f"{'scenario':<16} {'mode':<5} {'batches':>7} {'over':>5} {'over%':>6} {'>drop':>5} "
        f"{'rec/s':>8} {'vs phys':>7} {'drain':>6} {'phys':>6} {'final lag':>10} {'mean r':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        f = r.figures()

        def num(v: float | None, fmt: str) -> str:
            return "-" if v is None else ("inf" if v == float("inf") else format(v, fmt))

        lines.append(
            f"{r.scenario.name:<16} {r.mode:<5} {f.batches:>7} {f.over_interval:>5} {f.over_share:>6.1%} "
            f"{num(f.over_after_drop, 'd'):>5} {f.throughput:>8.1f} "
            f"{'-' if f.physical_throughput == 0 else format(f.throughput_share, '.1%'):>7} "
            f"{num(f.drain_batches, '.1f'):>6} {num(f.physical_drain, '.1f'):>6} {f.final_lag:>10} "
            f"{f.mean_ratio:>6.2f}"
        )
        if r.warning:
            lines.append(f"{'':<23}warning: {r.warning}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m airflow_kafka_backpressure.sim",
        description="Simulate the batch controller against a scenario or a pipeline's recorded history.",
    )
    p.add_argument("scenarios", nargs="*", help="shipped scenarios to run (default: all; see --list)")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.add_argument("--mode", choices=(*MODES, "both"), default="both", help="control mode(s) to run")
    p.add_argument("--settings", default="{}", help="settings JSON object (the settings Variable's keys)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one setting (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="noise seed (default: the scenario's)")
    p.add_argument("--svg", default="simulate.svg", help="where to write the plot (default: %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="do not write the plot")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.add_argument("--from-ledger", metavar="PIPELINE", help="replay a pipeline's recorded arrivals")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger (with --from-ledger)")
    g.add_argument("--conn-id", help="Airflow connection of the ledger (with --from-ledger; needs Airflow)")
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LEDGER_LIMIT,
        help="newest batches to read (default: %(default)s)",
    )
    args = p.parse_args(argv)

    catalogue = shipped()
    if args.list:
        for name, sc in catalogue.items():
            print(f"{name:<16} {sc.description}")
        return 0
    try:
        base = (
            parse_settings(args.settings, source="--settings").to_dict()
            if args.settings.strip() not in ("", "{}")
            else {}
        )
        base.update(_parse_set(args.set))
        modes = list(MODES) if args.mode == "both" else [args.mode]
        for mode in modes:
            settings_for(mode, base)  # refuse bad settings before running anything
        recorded: Recorded | None = None
        note = ""
        if args.from_ledger:
            if not (args.ledger_url or args.conn_id):
                p.error("--from-ledger needs --ledger-url or --conn-id")
            scenario, recorded, note = ledger_scenario(args)
            scenarios = [scenario]
        else:
            unknown = [n for n in args.scenarios if n not in catalogue]
            if unknown:
                p.error(f"unknown scenario(s) {unknown}; shipped: {sorted(catalogue)}")
            scenarios = [catalogue[n] for n in (args.scenarios or catalogue)]
            if args.seed is not None:
                scenarios = [s.with_seed(args.seed) for s in scenarios]
    except (SettingsError, HistoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    results = [simulate(sc, settings_for(mode, base)) for sc in scenarios for mode in modes]
    if args.json:
        print(
            json.dumps(
                {
                    "runs": [
                        {
                            "scenario": r.scenario.to_dict(),
                            "mode": r.mode,
                            "figures": r.figures().to_dict(),
                            "warning": r.warning,
                        }
                        for r in results
                    ],
                    "recorded": None if recorded is None else recorded.to_dict(),
                },
                indent=2,
            )
        )
    else:
        for sc in scenarios:
            print(f"{sc.name}: {sc.description}")
        if note:
            print(note)
        if recorded is not None:
            print(
                f"recorded: {recorded.batches} plans, {recorded.measured} measured batches, "
                f"{recorded.over_interval} over the interval, mean processing/interval "
                f"{'-' if recorded.mean_ratio is None else format(recorded.mean_ratio, '.2f')}, "
                f"lag left by the last plan {recorded.final_lag}"
            )
        print(figures_table(results))
    if not args.no_plot:
        rows = [(sc.name, [r for r in results if r.scenario is sc]) for sc in scenarios]
        Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
        Path(args.svg).write_text(render_svg(rows, target_ratio=settings_for(modes[0], base).target_ratio))
        if not args.json:
            print(f"plot: {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
