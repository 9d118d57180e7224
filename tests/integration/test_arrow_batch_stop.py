"""Stopping a running batch of the arrow writer (the default for a pipeline of the Python reader
without a transform: the Spark task that reads a range writes its Parquet file), with both engines,
under real Airflow, real Spark and a real broker. The pipelines name ``reader: python`` (the
session's Spark has the Kafka connector, which ``auto`` would pick).

The batch is held running by the network, not by the product: the broker sits behind a
:class:`.kafka_gate.FetchGate` that holds its Kafka fetches, so the batch's reading-and-writing
tasks wait inside their Kafka client. Then the batch is stopped as in :mod:`.test_batch_stop` (the
task killed), or its reader gives up (stalled), with the same checks: nothing the batch started runs on
(the Python workers that held the fetches included), nothing of its attempt is left in the sink, the
batch is failed with what happened, and the replay DAG completes it exactly once, with the arrow
writer.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kbp_local.producer import produce

from . import airflow_harness as af
from .kafka_gate import GatedBroker
from .test_batch_stop import (
    UDF_START_WAIT_S,
    ProcessWatch,
    check_failed_and_replay,
    check_stopped,
    engine_setup,  # noqa: F401 - a fixture
)
from .test_pipeline_e2e import airflow_db, make_pipeline  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """This module's broker (overrides the session's): the pipelines reach it through a gate."""
    broker = GatedBroker(tmp_path_factory.mktemp("gated")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def gate(kafka_broker):
    yield kafka_broker.gate
    kafka_broker.gate.open()


def kill_task_when_held(gate, result: dict) -> threading.Thread:
    """SIGTERM this process (the task process under dag.test) once a task's fetch is held."""

    def run() -> None:
        if gate.wait_for_held_fetch(UDF_START_WAIT_S):
            time.sleep(1.0)  # the other tasks of the stage reach their fetch too
            result["held"] = gate.held_pids()
            result["killed_at"] = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_killing_an_arrow_writer_batch_stops_it_and_it_replays_exactly_once(engine_setup, kafka_broker, gate):
    engine, server, make, _ = engine_setup
    p, ledger = make(name=f"akill_{engine}", replay_interval_s=20, reader="python")
    produce(kafka_broker.bootstrap, p.topics[0], count=120, partitions=4)
    gate.close()

    result: dict = {}
    with ProcessWatch(exclude_under=server.pid if server else None) as watch:
        killer = kill_task_when_held(gate, result)
        run = af.run_dag(p.ingest_dag_id, 0)
        killer.join(5)
    assert result.get("killed_at"), "no fetch of the batch was held: nothing was killed"
    assert result["held"], "no process was found holding the batch's fetch"
    assert run.task_states["ingest"] == "failed", run.task_states
    check_stopped(engine, server, watch, result["held"])
    manifest = check_failed_and_replay(
        make, p, ledger, gate.open, kafka_broker, 120, "killed", transform=None
    )
    assert manifest["writer"] == "arrow", manifest  # the default for raw records: the tasks wrote the files


def test_an_arrow_writer_batch_whose_fetches_stall_fails_and_replays_exactly_once(
    engine_setup, kafka_broker, gate
):
    """The other way a held batch ends: its reader gives up after ``stall_timeout_s`` (shorter than
    any batch timeout, the pipelines file insists). The tasks fail inside the arrow writer; the
    batch is failed with the reader's diagnosis, nothing of the attempt is left, and it replays."""
    engine, server, make, _ = engine_setup
    p, ledger = make(name=f"astall_{engine}", replay_interval_s=20, stall_timeout_s=15, reader="python")
    produce(kafka_broker.bootstrap, p.topics[0], count=120, partitions=4)
    gate.close()

    with ProcessWatch(exclude_under=server.pid if server else None) as watch:
        run = af.run_dag(p.ingest_dag_id, 0)
    assert gate.held_ports, "no fetch of the batch was held"
    assert run.task_states["ingest"] == "failed", run.task_states
    # the batch ended by itself: for connect, the server's Python workers live on to serve the next
    check_stopped(engine, server, watch, [], require_held=False)
    manifest = check_failed_and_replay(
        make, p, ledger, gate.open, kafka_broker, 120, "made no progress for 15s", transform=None
    )
    assert manifest["writer"] == "arrow", manifest
