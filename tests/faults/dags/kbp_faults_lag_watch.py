"""The fault suite's deferrable trigger: a lag sensor on the driver-kill scenario's pipeline that
waits in the triggerer (never fires: its threshold is out of reach) and reads Kafka there with the
rig's SCRAM user, so that the planted-password search of test_process_faults covers what the
triggerer logs while a trigger authenticates. It times out after LAG_WATCH_TIMEOUT_S and is then
skipped (soft_fail); a trigger that could not read Kafka fails the task instead."""

from __future__ import annotations

import json
import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_kafka_backpressure.sensors.kafka_lag import KafkaLagSensor

DAG_ID = "kbp_faults_lag_watch"
PIPELINE = "f_driver_kill"
LAG_WATCH_TIMEOUT_S = 40

PIPELINES_FILE = os.environ.get("KBP_PIPELINES_FILE")

if PIPELINES_FILE:  # in the rig's Airflow (the tests import only the constants above)
    with open(PIPELINES_FILE) as f:
        pipeline = next(p for p in json.load(f)["pipelines"] if p["name"] == PIPELINE)

    with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["kbp-faults"]):
        KafkaLagSensor(
            task_id="lag",
            pipeline=pipeline,
            max_lag_records=10**15,
            deferrable=True,
            poke_interval=5,
            timeout=LAG_WATCH_TIMEOUT_S,
            soft_fail=True,
        )
