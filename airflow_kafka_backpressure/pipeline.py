"""What a pipeline is: topics, consumer group, sink, batch interval, connections, policies.

One :class:`PipelineConfig` drives both DAGs of a pipeline (ingest and replay) and names its
Variables. Pure Python: no Airflow import.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .control.allocation import ON_DATA_LOSS, STARTING_OFFSETS

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    topics: tuple[str, ...]
    sink: str
    batch_interval_s: float = 60.0
    group_id: str | None = None  # consumer group to commit progress to; default "kbp-<name>"
    kafka_conn_id: str = "kafka_default"
    spark_conn_id: str = "spark_default"
    ledger_conn_id: str | None = None  # None: SQLite file under AIRFLOW_HOME
    starting_offsets: str = "earliest"
    on_data_loss: str = "fail"
    reader: str = "auto"
    transform: str | None = None
    executor_cores: int = 1
    executor_memory: str | None = None
    driver_memory: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    stall_timeout_s: float = 120.0
    replay_interval_s: float | None = None  # how often the replay DAG looks; default 5 x batch interval
    stale_after_s: float | None = None  # a batch planned/running this long is replayable; default 1 day
    replay_deferrable: bool = True  # the replay sensor waits in the triggerer, not in a worker slot
    start_date: str = "2026-01-01"
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def bad(key: str, value: Any, rule: str) -> ValueError:
            return ValueError(f"pipeline {self.name!r}: {key} = {value!r} is invalid: {rule}")

        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise bad("name", self.name, "use letters, digits, '_', '.', '-' (at most 100)")
        topics = (self.topics,) if isinstance(self.topics, str) else tuple(self.topics)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise bad("topics", self.topics, "give at least one topic name")
        object.__setattr__(self, "topics", topics)
        object.__setattr__(self, "tags", tuple(self.tags))
        if not self.sink:
            raise bad("sink", self.sink, "give a path or Hadoop URI for the output")
        if not self.batch_interval_s > 0:
            raise bad("batch_interval_s", self.batch_interval_s, "must be > 0 seconds")
        if self.starting_offsets not in STARTING_OFFSETS:
            raise bad("starting_offsets", self.starting_offsets, f"one of {STARTING_OFFSETS}")
        if self.on_data_loss not in ON_DATA_LOSS:
            raise bad("on_data_loss", self.on_data_loss, f"one of {ON_DATA_LOSS}")
        if self.reader not in ("auto", "python", "native"):
            raise bad("reader", self.reader, "one of auto, python, native")
        if self.transform is not None and ":" not in self.transform:
            raise bad("transform", self.transform, "use 'package.module:function'")
        if self.executor_cores < 1:
            raise bad("executor_cores", self.executor_cores, "must be >= 1")

    # ----- derived names ----------------------------------------------------------------------
    @property
    def group(self) -> str:
        return self.group_id or f"kbp-{self.name}"

    @property
    def batch_interval_ms(self) -> int:
        return int(round(self.batch_interval_s * 1000))

    @property
    def settings_variable(self) -> str:
        """Gains and limits (JSON), edited by users."""
        return f"kbp.{self.name}.settings"

    @property
    def controller_variable(self) -> str:
        """PID state (JSON), written by the record task."""
        return f"kbp.{self.name}.controller_state"

    @property
    def executors_variable(self) -> str:
        """Executor target (JSON), written by the scale task."""
        return f"kbp.{self.name}.executor_target"

    @property
    def ingest_dag_id(self) -> str:
        return f"kbp_ingest_{self.name}"

    @property
    def replay_dag_id(self) -> str:
        return f"kbp_replay_{self.name}"

    # ----- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["topics"] = list(self.topics)
        d["tags"] = list(self.tags)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"pipeline {d.get('name')!r}: unknown key(s) {unknown}; allowed: {sorted(known)}"
            )
        return cls(**d)

    @classmethod
    def load_all(cls, text: str, source: str = "pipelines file") -> list[PipelineConfig]:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not valid JSON: {e}") from e
        items = raw.get("pipelines", raw) if isinstance(raw, dict) else raw
        if not isinstance(items, list):
            raise ValueError(f'{source}: expected a list of pipelines or {{"pipelines": [...]}}')
        configs = [cls.from_dict(x) for x in items]
        names = [c.name for c in configs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{source}: pipeline names must be unique; repeated: {dupes}")
        return configs
