"""The maintenance task of a pipeline's table (the DAG ``kbp_maintain_<name>``): compaction,
snapshot expiry and removal of unreferenced files (:meth:`~..sinks.SinkFormat.maintain`), under the
ledger's lock of the table, which every batch job into the table holds too
(:func:`~.common.sink_commit_lock`): the maintenance never commits beside a batch.

It runs in the task's own process (delta-rs or pyiceberg, no Spark job): stopping the task stops
it, and the lock goes with the process. Each of its commits is one table transaction, so a
maintenance stopped midway leaves the table as its last commit left it, every row once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..sinks import sink_format_for
from .base import PipelineOperator
from .common import maintenance_lock, save_maintenance


class MaintainTableOperator(PipelineOperator):
    """Maintains the pipeline's table (and its error table, for a pipeline that decodes records)
    as the pipeline's ``maintenance`` says. XCom: one report per table (files and bytes per
    partition before and after, what compaction replaced, snapshots expired, files deleted); the
    Variable ``kbp.<name>.maintenance`` keeps the last run's, which the monitoring page shows."""

    ui_color = "#e8f0fd"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        p = self.pipeline
        if p.maintenance is None:
            raise ValueError(
                f"pipeline {p.name!r} has no maintenance: give it a maintenance object in the pipelines file"
            )
        fmt = sink_format_for(p.sink_format, p.sink_options.job_options())
        tables = [(p.sink, p.maintenance)]
        if p.decoders():  # the records that did not decode: a table of the same format beside it
            tables.append((fmt.error_table(p.sink), replace(p.maintenance, sort_by=None)))  # type: ignore[attr-defined]
        reports = []
        with maintenance_lock(p, self.ledger):
            for sink, options in tables:
                report = fmt.maintain(sink, options)
                self.log.info("Maintenance: %s", report.summary())
                reports.append(report.as_dict())
        # the monitoring page shows the last one (files and bytes per partition, what it did)
        save_maintenance(p, {"run_id": context["run_id"], "at": context["ts"], "tables": reports})
        return reports

    def on_kill(self) -> None:
        # nothing runs outside this process: its end ends the work and releases the table's lock;
        # a commit is one transaction, so the table holds what the last one left
        self.log.info(
            "Maintenance of pipeline %r stopped; the table keeps its last commit", self._pipeline.name
        )
