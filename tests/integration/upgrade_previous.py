"""The previous release's side of the upgrade test (:mod:`.test_upgrade`), run in a process of its
own with the previous release's package first on ``PYTHONPATH``::

    python -m tests.integration.upgrade_previous <package dir> <pipeline JSON> <bootstrap>

It leaves a pipeline as a deployment of that release would be when its workers are upgraded: one
batch ingested through the shipped ingest DAG (the ledger's schema, the controller's state, the
settings Variable and the sink all of that release), one batch whose worker died after the sink's
commit and before the ledger's mark (``running`` under a dead attempt), one batch that failed (its
executors Variable was broken while it was ingested). It prints one JSON line: what it left.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The settings the pipeline runs with on both sides of the upgrade (Spark's mode, no floor).
SETTINGS = {"mode": "spark", "min_rate": 1}
#: The attempt that died after its commit, before its mark.
DEAD = "deadbeef" * 4


def main(package_dir: str, pipeline_json: str, bootstrap: str) -> None:
    import airflow_kafka_backpressure as package

    here = Path(package.__file__).resolve()
    if Path(package_dir).resolve() not in here.parents:
        raise SystemExit(f"the previous release was not imported: airflow_kafka_backpressure is {here}")

    from airflow_kafka_backpressure.config.pipeline import PipelineConfig
    from airflow_kafka_backpressure.hooks.ledger import LedgerHook
    from kbp_local.producer import produce

    from . import airflow_harness as af
    from .test_replay_reliability import write_without_mark

    p = PipelineConfig.from_dict(json.loads(pipeline_json))
    ledger = LedgerHook(p.ledger_conn_id).get_conn()  # that release's hook, as its tasks reach the ledger
    topic = p.topics[0]

    af.set_variable(p.settings_variable, json.dumps(SETTINGS))
    produce(bootstrap, topic, count=40, partitions=4)  # ids 0..39
    first = af.run_dag(p.ingest_dag_id, 0)
    assert first.state == "success", first.task_states

    # ids 40..79: offsets 10..20 of each partition, written by attempt DEAD, never marked
    plan, metrics = write_without_mark(p, ledger, bootstrap, DEAD, start_id=40, offsets=(10, 20))
    assert metrics.records == 40, metrics

    produce(bootstrap, topic, count=40, partitions=4, start_id=80)  # ids 80..119: a batch that fails
    af.set_variable(p.executors_variable, "{not json")
    failed = af.run_dag(p.ingest_dag_id, 1)
    assert failed.task_states["ingest"] == "failed", failed.task_states
    af.set_variable(p.executors_variable, json.dumps({"executors": 1}))

    print(
        json.dumps(
            {
                "package": str(here.parent),
                "revision": ledger.schema_revision(),
                "batches": {b.batch_id: b.status for b in ledger.recent_batches(p.name)},
                "written_not_marked": plan.batch_id,
                "controller": af.variable(p.controller_variable),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
