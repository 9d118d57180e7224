"""End to end: the cost mode holds the real job's processing ratio at its target.

Real parts only: the shipped ingest DAG under Airflow (``dag.test``), Apache Kafka, a Spark
Connect server (``local[2]``: the connect engine, the one with the small fixed cost per batch) and
a SQLite ledger. The job's transform costs a known time per record (a sleep in the Python worker,
:func:`e2e_transforms.cost_per_record`), a cost that does not change with the machine's load.

The topic holds a backlog far larger than the pipeline can read in the test's batches, so every
batch is sized by the controller (never by "everything that is there"). The ratio of a batch is
``processing_ms / batch interval`` from the ledger: what the controller itself is judged by.

On a loaded 2-core machine the fixed cost is what moves: over Connect a batch opens a session,
uploads its artifacts and starts cold Python workers (Data Source, transform, sink), measured at
5-20 s at a load average of 2-7, 27-50 s at 16 and 45-60 s at 40-50, and a batch now and then
takes 30 s more when someone else's job lands on it. No controller can take that out of one
batch, so the settled ratio is the median of the last batches — one unlucky batch cannot fail the
test, while a controller aiming elsewhere moves the median out of the band. The interval is 40 s
(24 s of work at the target; with Connect sessions reused the fixed cost on an idle machine is a
few seconds; 60 s until 2026-11-25, which made this the suite's slowest test at 5.3 minutes); on
a machine loaded beyond a load average of ~5 set ``KBP_TEST_CONTROLLER_INTERVAL_S=120`` so that
the target stays reachable and mostly per-record work. The cost model needs about 6 batches here (its line through the batches is trusted once
6 one-batch-ahead errors are known; before that a cold first batch and the drifting fixed cost keep
it on the proportional guess). The first batch reads a third of the target's records (it read a
sixth, and batch 10 was still climbing at 0.54-0.69), so the last 4 of 10 are judged: one batch
slowed by a neighbour (1,848 records in 31.7 s beside 1,780 in 19.6 s, measured with a second
Spark test running) cannot move the median out of the band, while a controller aiming at 0.9 or
0.45 does. (With 8 batches, a sixth of the target first and the last 4 judged, a controller told 0.9
still passed: it had not got there yet.) Measured at 60 s: settled ratio 0.59 at a load of 8-15,
0.67 at 25-35; at 40 s (3.2-4.5 minutes): medians of the last 4 of 0.53 and 0.60.
"""

from __future__ import annotations

import json
import os
import statistics

import pytest

from kbp_local.producer import produce

from . import airflow_harness as af

# processing at the target is 0.6 x the interval: per-record work is most of it unless the fixed cost nears it
INTERVAL_S = int(os.environ.get("KBP_TEST_CONTROLLER_INTERVAL_S", "40"))
TARGET = 0.6
TOLERANCE = 0.15  # relative: the settled ratio lies within ±15% of the target
BATCHES = 10
SETTLED = 4  # the median of the last SETTLED batches is judged; the ones before find the cost model
BACKLOG = 100_000  # records: more than BATCHES batches can take, even a controller aiming at 0.9 (~30k here)


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


def test_cost_mode_settles_the_processing_ratio_at_its_target(
    request, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db
):
    make = af.engine_pipeline_maker(
        request, "connect", monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )
    p, ledger = make(
        batch_interval_s=INTERVAL_S, transform="tests.integration.e2e_transforms:cost_per_record"
    )
    produce(kafka_broker.bootstrap, p.topics[0], count=BACKLOG, partitions=4)
    # target = max ratio: with a backlog the cost mode drains at max_ratio less its noise margin but
    # never below the target, so with the two equal the batches aim at the target. The first batch
    # reads initial_rate x interval records (640 at 40 s, a third of the target's); scaling off keeps the executors fixed.
    af.set_variable(
        p.settings_variable,
        json.dumps(
            {
                "mode": "cost",
                "target_ratio": TARGET,
                "max_ratio": TARGET,
                "initial_rate": 16,
                "scaling_enabled": False,
            }
        ),
    )

    lags = []
    for n in range(BATCHES):
        r = af.run_dag(p.ingest_dag_id, n, INTERVAL_S)
        assert r.state == "success", r.task_states
        lags.append(ledger.batch(n + 1).plan.lag)
    assert all(lag > 0 for lag in lags), (
        lags
    )  # a backlog was left behind every batch: the controller sized them all

    batches = sorted(ledger.recent_batches(p.name, 100, ["succeeded"]), key=lambda b: b.batch_id)
    assert len(batches) == BATCHES
    ratios = [b.processing_ms / p.batch_interval_ms for b in batches]
    table = "\n".join(
        f"batch {b.batch_id}: {b.records} records, {b.processing_ms} ms, ratio {x:.2f}"
        for b, x in zip(batches, ratios)
    )
    print(table)
    settled = statistics.median(ratios[-SETTLED:])
    state = af.variable(p.controller_variable)
    fit = state["cost"]["fit"]
    assert abs(settled / TARGET - 1) <= TOLERANCE, (
        f"settled ratio {settled:.2f}, target {TARGET}; cost model: fixed {fit['fixed_s']:.1f} s + "
        f"{fit['per_record_s'] * 1000:.1f} ms/record ({fit['method']}) — a fixed cost near "
        f"{TARGET * INTERVAL_S:.0f} s means the machine is too loaded for the target to be reachable\n{table}"
    )
    assert state["mode"] == "cost" and fit["per_record_s"] > 0, state
