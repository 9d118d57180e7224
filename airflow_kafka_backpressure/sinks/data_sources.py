"""Registering the package's Python Data Sources with a session, once per session object.

Registering a Python Data Source again replaces it (Spark logs "replaced a previously registered
data source") and costs the next query a fresh start of its Python side — measured here at about
0.5 s of a 100,000-record batch on ``local[2]``. A classic session lives as long as the driver (one
batch under the submit engine, many in a test or a benchmark); a Connect client session object is
one batch's, so its sources are registered once per batch.

The sinks' sources (the Parquet directory's writer and manifest reader) and the readers' (the
Python reader's Kafka source) register here: it sits with the sinks, which the batch job and its
readers build on.
"""

from __future__ import annotations

import weakref
from typing import Any

_registered: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def register(spark: Any, *sources: Any) -> None:
    """Register each Data Source class in ``sources`` with ``spark`` unless it already was."""
    try:
        done = _registered.setdefault(spark, set())
    except TypeError:  # a session type that takes no weak reference: register every time
        done = set()
    for source in sources:
        name = source.name()
        if name not in done:
            spark.dataSource.register(source)
            done.add(name)
