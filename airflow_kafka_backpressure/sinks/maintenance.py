"""A table's maintenance: compaction, snapshot expiry and removal of files nothing needs, for the
table formats (:meth:`~.table.TableFormat.maintain`; Delta in :mod:`.delta_maintenance`, Iceberg in
:mod:`.iceberg_maintenance`). The DAG ``kbp_maintain_<name>`` runs it
(:class:`~..operators.maintain.MaintainTableOperator`) under the ledger's lock of the table, which
every batch job into a maintained table holds too: a maintenance never commits beside a batch.

Both formats run here, in the Airflow worker, without Spark: merging a partition's small files is
reading and writing a few files, and Iceberg's Spark runtime has no build for Spark 4.2. Delta's
through delta-rs (``deltalake``, the ``delta`` extra), Iceberg's through pyiceberg (the ``iceberg``
extra).

**The retention rule** (docs/sinks.md, "Maintenance"): nothing is dropped that is younger than
``retention_hours``, and the pipelines file is refused when that is shorter than the longest a
batch can be in flight (``PipelineConfig.longest_batch_in_flight_s``). A batch's attempt reads the
table's snapshot and writes its files before it commits, and a replay's adoption and fencing read
the batch's commit back from the table's history: none of that is removed while it can be read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: The snapshot summary / commit property a maintenance's commit carries (its report's facts).
MAINTENANCE_PROPERTY = "kbp.maintenance"


@dataclass(frozen=True)
class PartitionFiles:
    """The live data files of one partition of a table and their bytes."""

    files: int
    bytes: int


@dataclass
class MaintenanceReport:
    """What one maintenance did to one table: the files per partition before and after (partition
    ``""``: an unpartitioned table), what compaction replaced, what expired and what was deleted."""

    table: str
    format: str
    before: dict[str, PartitionFiles] = field(default_factory=dict)
    after: dict[str, PartitionFiles] = field(default_factory=dict)
    files_removed: int = 0
    files_added: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0
    version: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, for the task's XCom and the log."""
        return asdict(self)

    def summary(self) -> str:
        def files(parts: Mapping[str, PartitionFiles]) -> int:
            return sum(p.files for p in parts.values())

        most = max((p.files for p in self.after.values()), default=0)
        return (
            f"{self.format} table {self.table}: {files(self.before)} -> {files(self.after)} data files in "
            f"{len(self.after)} partition(s) (at most {most} in one); compaction replaced {self.files_removed} "
            f"file(s) with {self.files_added}; {self.snapshots_expired} snapshot(s) expired, "
            f"{self.files_deleted} unreferenced file(s) deleted; now at version {self.version}"
            + "".join(f"; {n}" for n in self.notes)
        )

    def commit_property(self) -> str:
        """The JSON a compaction's commit carries (:data:`MAINTENANCE_PROPERTY`)."""
        return json.dumps(
            {"files_removed": self.files_removed, "files_added": self.files_added}, sort_keys=True
        )


def partition_key(values: Mapping[str, Any]) -> str:
    """A partition's name in a report: ``col=value`` pairs, ``""`` for an unpartitioned table."""
    return "/".join(f"{k}={'' if v is None else v}" for k, v in sorted(values.items()))


def tally(files: list[tuple[str, int]]) -> dict[str, PartitionFiles]:
    """(partition, bytes) of each live file, as files and bytes per partition."""
    out: dict[str, list[int]] = {}
    for key, size in files:
        out.setdefault(key, []).append(int(size))
    return {k: PartitionFiles(len(v), sum(v)) for k, v in sorted(out.items())}


def retention_hours_whole(retention_s: float) -> int:
    """The retention in whole hours, rounded up (Delta's VACUUM takes hours): never shorter."""
    return max(0, -(-int(retention_s) // 3600))
