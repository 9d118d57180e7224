"""The simulator's command line, and ``--from-ledger`` on a real SQLite ledger written through the
public Ledger API."""

from __future__ import annotations

import json

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.sim import __main__ as cli
from airflow_kafka_backpressure.sim.history import HistoryError, scenario_from_history

PIPELINE = "orders"
FIXED_S, PER_RECORD_S, RATE, INTERVAL_MS = 20.0, 0.0004, 1000.0, 60_000
SIZES = [40_000, 70_000, 55_000, 90_000, 60_000, 65_000, 50_000, 80_000, 60_000, 75_000]


def write_history(url: str) -> Ledger:
    """Ten batches of a pipeline whose jobs take 20 s + 0.4 ms per record, 1,000 records/s in."""
    ledger = Ledger(url)
    ledger.create_all()
    head, t0 = 0, 1_700_000_000_000
    for i, size in enumerate(SIZES):
        planned = t0 + i * INTERVAL_MS
        latest = int(RATE * (i + 1) * INTERVAL_MS / 1000)
        until = min(head + size, latest)
        plan = ledger.record_plan(
            PIPELINE,
            f"scheduled__{i}",
            [OffsetRange("orders", 0, head, until)],
            "/sink",
            INTERVAL_MS,
            planned,
            rate=size / 60,
            lag=latest - until,
        )
        records = until - head
        processing_ms = int((FIXED_S + PER_RECORD_S * records) * 1000)
        ledger.mark_running(plan.batch_id, executors=1, at_ms=planned + 1_000)
        ledger.mark_succeeded(plan.batch_id, records, processing_ms, at_ms=planned + 1_000 + processing_ms)
        ledger.record_metrics(plan.batch_id, scheduling_delay_ms=1_500, executors=1)
        head = until
    return ledger


@pytest.fixture
def ledger_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    write_history(url).dispose()
    return url


def test_history_rebuilds_arrivals_and_fits_the_cost(ledger_url):
    ledger = Ledger(ledger_url)
    scenario, fit, recorded = scenario_from_history(ledger.recent_batches(PIPELINE, 100), PIPELINE)
    ledger.dispose()
    assert fit.method == "theil-sen"
    assert fit.fixed_s == pytest.approx(FIXED_S, abs=0.05)
    assert fit.per_record_s == pytest.approx(PER_RECORD_S, rel=1e-3)
    assert (recorded.batches, recorded.measured, recorded.over_interval) == (10, 10, 0)
    assert scenario.batch_interval_s == 60.0 and scenario.scheduler_latency_s == 1.5
    # what had arrived at the first plan arrives at once; then the recorded 1,000 records/s
    assert scenario.arrivals.arrived(60.0) == 60_000
    assert scenario.arrivals.rate_at(60.0 + 5 * 60) == pytest.approx(RATE)


def test_from_ledger_replays_the_pipeline_under_each_mode(ledger_url, tmp_path, capsys):
    svg = tmp_path / "replay.svg"
    assert cli.main(["--from-ledger", PIPELINE, "--ledger-url", ledger_url, "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "fit:" in out and '"method": "theil-sen"' in out
    assert "recorded: 10 plans, 10 measured batches" in out
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith(f"ledger:{PIPELINE} ")]
    assert rows == [[f"ledger:{PIPELINE}", "spark"], [f"ledger:{PIPELINE}", "cost"]]
    assert svg.read_text().startswith("<svg") and "mode cost" in svg.read_text()


def test_from_ledger_with_given_gains_as_json(ledger_url, capsys):
    code = cli.main(
        [
            "--from-ledger",
            PIPELINE,
            "--ledger-url",
            ledger_url,
            "--mode",
            "spark",
            "--set",
            "proportional=0.5",
            "--set",
            "integral=0",
            "--json",
            "--no-plot",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in data["runs"]] == ["spark"]
    assert data["recorded"]["batches"] == 10 and data["runs"][0]["figures"]["batches"] > 5


def test_from_ledger_errors_name_what_is_missing(ledger_url, capsys):
    assert cli.main(["--from-ledger", "nope", "--ledger-url", ledger_url, "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "'nope' has no batches" in err and "orders" in err
    with pytest.raises(HistoryError, match="at least 2"):
        ledger = Ledger(ledger_url)
        scenario_from_history(ledger.recent_batches(PIPELINE, 1), PIPELINE)


def test_shipped_scenarios_table_and_bad_settings(tmp_path, capsys):
    assert cli.main(["burst", "--svg", str(tmp_path / "b.svg")]) == 0
    out = capsys.readouterr().out
    assert out.count("burst ") >= 2 and "drain" in out
    assert cli.main(["burst", "--set", "min_rate=0.5", "--no-plot"]) == 2
    assert "'min_rate' = 0.5" in capsys.readouterr().err
    assert cli.main(["--list"]) == 0 and "issue-drop" in capsys.readouterr().out
