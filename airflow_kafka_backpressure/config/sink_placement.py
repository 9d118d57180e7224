"""Where a pipeline's sink may be: the sink refusals the plan task checks before anything is
planned (:func:`sink_refusal`), and pipelines that would share a sink or a consumer group
(:func:`sharing_problems`, checked when the pipelines file loads). Pure, but for resolving local
symbolic links.

It reads a pipeline through :class:`Placed` (what :class:`~.pipeline.PipelineConfig` has), and its
sink format through the registry (:attr:`~.sinks.SinkFormat.needs_directory_renames`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from airflow_kafka_backpressure.sinks import SINK_FORMATS
from airflow_kafka_backpressure.storage import SCHEME_ALIASES


class Placed(Protocol):
    """What the placement rules read of a pipeline."""

    @property
    def name(self) -> str: ...
    @property
    def sink(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def sink_format(self) -> str: ...
    @property
    def sink_on_shared_filesystem(self) -> bool: ...


def sink_key(sink: str) -> tuple[str, ...]:
    """The place ``sink`` names, as path components for comparison: a local path with symbolic
    links resolved (as far as they exist), a URI with its scheme's alias resolved (``s3a`` is
    ``s3``) and no trailing slash."""
    if "://" in sink and not sink.startswith("file://"):
        scheme, _, rest = sink.partition("://")
        scheme = SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
        return (scheme, *[part for part in rest.split("/") if part])
    path = os.path.realpath(sink[len("file://") :] if sink.startswith("file://") else sink)
    return ("file", *[part for part in path.split(os.sep) if part])


def sharing_problems(configs: Sequence[Placed]) -> list[str]:
    """Pairs of pipelines that would mix their batches or their commits: one sink (or one inside
    the other's), or one consumer group (pure, but for resolving local symbolic links)."""
    problems = []
    for i, a in enumerate(configs):
        for b in configs[i + 1 :]:
            ka, kb = sink_key(a.sink), sink_key(b.sink)
            if ka == kb:
                problems.append(
                    f"pipelines {a.name!r} and {b.name!r} write the same sink ({a.sink!r}, {b.sink!r}): their "
                    "batches would replace each other's; give each pipeline its own sink"
                )
            elif ka[: len(kb)] == kb or kb[: len(ka)] == ka:
                outer, inner = (a, b) if len(ka) < len(kb) else (b, a)
                problems.append(
                    f"pipeline {inner.name!r}'s sink {inner.sink!r} is inside pipeline {outer.name!r}'s sink "
                    f"{outer.sink!r}: readers of the outer one would see both; give each pipeline a sink of its own"
                )
            if a.group == b.group:
                problems.append(
                    f"pipelines {a.name!r} and {b.name!r} commit the same consumer group {a.group!r}: each would "
                    "move the other's offsets; set a different group_id on one of them"
                )
    return problems


#: Schemes of object stores: no directory rename, which some sink formats publish with
#: (:attr:`~.sinks.SinkFormat.needs_directory_renames`: the Parquet directory).
OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs", "oss")


def sink_refusal(p: Placed, spark_master: str | None) -> str | None:
    """Why the pipeline's sink cannot hold its guarantees where it runs (pure), else None: checked
    by the plan task before anything is planned. ``spark_master``: the submit engine's master (None
    when unknown, as for a Spark Connect server)."""
    scheme = p.sink.split("://", 1)[0].lower() if "://" in p.sink else ""
    fmt = SINK_FORMATS.get(p.sink_format)
    if scheme in OBJECT_STORE_SCHEMES and fmt is not None and fmt.needs_directory_renames:
        instead = " or ".join(
            f'sink_format "{other.name}"' + (f" ({other.summary})" if other.summary else "")
            for other in SINK_FORMATS.values()
            if not other.needs_directory_renames
        )
        return (
            f"Pipeline {p.name!r}: sink {p.sink!r} is on an object store ({scheme}://). The {fmt.name} sink "
            f"({fmt.summary}) publishes each batch by renaming directories, which object stores cannot do: every "
            "commit would fail, and a reader of the sink could see a batch in part or twice. Write to a local path "
            f"or HDFS (hdfs://…), or use a sink format that commits without renaming directories: {instead}. "
            "Nothing was planned."
        )
    local = scheme in ("", "file")
    if local and spark_master and not p.sink_on_shared_filesystem:
        from airflow_kafka_backpressure.engines.submit import is_loopback_master  # defers psutil

        if not is_loopback_master(spark_master):
            return (
                f"Pipeline {p.name!r}: sink {p.sink!r} is a local path, but Spark master {spark_master!r} can run "
                "executors on other hosts: each would write its part of a batch to its own disk, and the commit "
                "would publish only what this host sees (a batch committed with rows missing). Use a shared "
                "filesystem's URI (hdfs://…), or, if this path is one shared filesystem (NFS …) mounted at the same "
                'place on every host, set "sink_on_shared_filesystem": true. Nothing was planned.'
            )
    return None
