"""Issue 43, item 4: a pipeline running on the previous release is upgraded in place — its ledger
(schema and rows), controller state, settings Variable and sink, with batches in flight — and goes
on with every record once.

The previous release: no release of this package has been published yet, so the wheel in
``tests/data/previous_release/`` stands in for it: the build of the last main that passed CI (its
README names the commit; ``scripts/previous_release_wheel.sh <ref>`` builds it again, and is what
a release replaces it with). It is installed into a folder of its own and runs, in a process of its
own with that folder first on ``PYTHONPATH`` (:mod:`.upgrade_previous`): the shipped DAGs under real
Airflow (``dag.test()``, the test's SQLite metadata DB), the connect engine on the session's Spark
Connect server, the real broker and a SQLite ledger. It leaves one batch ingested by the ingest DAG,
one whose batch job committed to the sink and whose worker died before the ledger's mark (its plan
and job run by hand, as the adoption tests do), one failed by the ingest DAG. Then this checkout's
package, in this process, takes over the same deployment. The sink is read back with pyarrow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_kafka_backpressure.batch.models import TopicPartition
from airflow_kafka_backpressure.ledger.migrate import head_revision
from kbp_local.producer import produce

from . import airflow_harness as af
from .test_pipeline_e2e import committed, expected_controller, sink_ids
from .upgrade_previous import DEAD, SETTINGS

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "tests" / "data" / "previous_release"


@pytest.fixture(scope="module")
def airflow_db():
    af.reset_airflow_db()


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    """The previous release's package, installed (without its dependencies: they are this
    environment's) into a folder of its own."""
    (wheel,) = WHEELS.glob("airflow_provider_kafka_backpressure-*.whl")
    target = tmp_path_factory.mktemp("previous-release")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    return target


def test_a_pipeline_upgraded_in_place_with_batches_in_flight_goes_on_with_every_record_once(
    request, kafka_broker, topic_name, tmp_path, monkeypatch, airflow_db, previous_release
):
    make = af.engine_pipeline_maker(
        request, "connect", monkeypatch, kafka_broker.bootstrap, topic_name, tmp_path
    )
    p, ledger = make(replay_interval_s=20)
    topic = p.topics[0]

    # the previous release runs the pipeline: its package first on the path (-P: not the checkout
    # as the working directory, ahead of it), with this process's Fernet key, as a deployment's
    # processes share theirs (Airflow's unit-test mode draws one per process)
    from airflow.configuration import conf

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(previous_release), str(REPO)]),
        "AIRFLOW__CORE__FERNET_KEY": conf.get("core", "fernet_key"),
    }
    old = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "tests.integration.upgrade_previous",
            str(previous_release),
            json.dumps(p.to_dict()),
            kafka_broker.bootstrap,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert old.returncode == 0, old.stdout[-4000:] + old.stderr[-8000:]
    left = json.loads(old.stdout.strip().splitlines()[-1])
    assert Path(left["package"]).is_relative_to(previous_release)
    assert left["batches"] == {"1": "succeeded", "2": "running", "3": "failed"}
    assert left["written_not_marked"] == 2
    assert sink_ids(p.sink) == Counter(range(80))  # batch 2's rows are in the sink, not yet marked
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 10 for q in range(4)}

    # upgraded in place: this checkout's package, the same deployment. The dead attempt's lease
    # runs out, and the replay DAG adopts batch 2 (its commit by the previous release read back)
    # and replays batch 3
    ledger.renew_lease(2, DEAD, 1)
    time.sleep(0.05)
    r = af.run_dag(p.replay_dag_id, 0)
    assert r.state == "success", r.task_states
    assert sorted((x["batch_id"], x["records"], x["adopted"], x["lost"]) for x in r.xcoms["replay"]) == [
        (2, 40, True, 0),
        (3, 40, False, 0),
    ]
    # the previous release left the ledger at its own schema revision (0007 for the wheel here);
    # this package's first task upgraded it in place, under the batches in flight, to its newest
    # (revisions are numbered in order)
    assert int(left["revision"]) <= int(head_revision())
    assert ledger.schema_revision() == head_revision()

    produce(kafka_broker.bootstrap, topic, count=40, partitions=4, start_id=120)
    r = af.run_dag(p.ingest_dag_id, 2)
    assert r.state == "success", r.task_states
    # the settings Variable the previous release ran with still sets the mode, and the controller's
    # state goes on from the previous release's: Spark's estimator over both releases' batches
    assert r.xcoms["record"]["mode"] == SETTINGS["mode"]
    state, rate_limit = expected_controller(ledger, p, [(1.0, 0.2, 0.0, SETTINGS["min_rate"])] * 2)
    stored = af.variable(p.controller_variable)["spark"]
    assert stored["estimator"]["state"] == state != left["controller"]["spark"]["estimator"]["state"]
    assert stored["rate_limit"] == rate_limit

    assert {b.batch_id: b.status for b in ledger.recent_batches(p.name)} == {
        1: "succeeded",
        2: "replayed",
        3: "replayed",
        4: "succeeded",
    }
    assert sink_ids(p.sink) == Counter(range(160))  # every record once
    assert committed(kafka_broker.bootstrap, p) == {TopicPartition(topic, q): 40 for q in range(4)}
