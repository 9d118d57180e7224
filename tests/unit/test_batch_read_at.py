"""What a reader needs to read the table as a batch's commit left it (``read_at``): carried from
the sink's commit through the batch's metrics to its Asset event, and absent from older records."""

from __future__ import annotations

from airflow_kafka_backpressure.batch.models import BatchMetrics, OffsetRange
from airflow_kafka_backpressure.operators.assets import batch_event_extra
from airflow_kafka_backpressure.sinks.table import BatchCommit

RANGES = (OffsetRange("t", 0, 0, 5),)


def metrics(**kw) -> BatchMetrics:
    return BatchMetrics(7, 5, 50, 1_000, 1_500, 2_000, 1, **kw)


def test_a_commits_read_at_reaches_the_metrics_and_the_event():
    commit = BatchCommit("p", 7, 2, RANGES, 5, version=42, read_at={"version": 42})
    assert commit.reported().read_at == {"version": 42}
    m = metrics(read_at={"snapshot_id": 9, "metadata": "s3a://b/t/metadata/00003.metadata.json"})
    assert BatchMetrics.from_dict(m.to_dict()).read_at == m.read_at
    extra = batch_event_extra(
        7, RANGES, 5, replay=False, output_path="/t", sink_format="iceberg", read_at=m.read_at
    )
    assert extra["read_at"] == m.read_at


def test_metrics_and_events_without_it_still_load():
    old = {k: v for k, v in metrics().to_dict().items() if k != "read_at"}
    assert BatchMetrics.from_dict(old).read_at is None
    assert batch_event_extra(7, RANGES, 5, replay=False, output_path="/t")["read_at"] is None
    assert BatchCommit("p", 7, 1, RANGES, 5).reported().read_at is None


def test_the_event_names_the_tables_last_maintenance_from_its_variables_report():
    from airflow_kafka_backpressure.operators.common import maintenance_summary

    state = {
        "run_id": "scheduled__2026-11-30T00:00:00+00:00",
        "at": "2026-11-30T00:00:00+00:00",
        "tables": [
            {"table": "/t", "version": "8", "files_removed": 12, "files_added": 2, "snapshots_expired": 3},
            {"table": "/t_errors", "version": "2", "files_removed": 0, "files_added": 0},
        ],
    }
    summary = maintenance_summary(state)
    assert summary == {
        "run_id": state["run_id"],
        "at": state["at"],
        "version": "8",  # the pipeline's table, not its error table
        "files_removed": 12,
        "files_added": 2,
    }
    extra = batch_event_extra(7, RANGES, 5, replay=False, output_path="/t", last_maintenance=summary)
    assert extra["last_maintenance"] == summary
    assert batch_event_extra(7, RANGES, 5, replay=False, output_path="/t")["last_maintenance"] is None
