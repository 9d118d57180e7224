"""Ingest and replay DAGs for every pipeline in the pipelines file.

The file is ``$KBP_PIPELINES_FILE``, else ``pipelines.json`` beside this file. Each entry is a
:class:`airflow_kafka_backpressure.config.pipeline.PipelineConfig` as JSON, e.g.::

    {"pipelines": [{"name": "demo", "topics": ["demo-events"], "sink": "/data/demo",
                    "batch_interval_s": 30}]}
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_kafka_backpressure.dag_factory import PIPELINES_FILE_ENV, build_dags, load_pipelines

_file = os.environ.get(PIPELINES_FILE_ENV) or str(Path(__file__).with_name("pipelines.json"))
if Path(_file).exists():
    globals().update(build_dags(load_pipelines(_file)))
