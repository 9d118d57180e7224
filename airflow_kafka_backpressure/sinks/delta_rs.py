"""delta-rs (``deltalake``) access to a Delta table without Spark: what the Delta sink's
maintenance (:mod:`.delta_maintenance`) and a downstream task's read (``DeltaSink.table_dataset``)
open the table with. ``s3a://`` is read as ``s3://`` with the worker's ``AWS_*`` environment.
"""

from __future__ import annotations

import os
from typing import Any


def delta_rs_location(path: str) -> tuple[str, dict[str, str] | None]:
    """``path`` as delta-rs opens it: ``s3a://`` as ``s3://``, with the ``AWS_*`` environment (an
    ``http://`` ``AWS_ENDPOINT_URL`` allowed)."""
    uri = "s3://" + path.split("://", 1)[1] if path.startswith(("s3a://", "s3n://")) else path
    options = (
        {"AWS_ALLOW_HTTP": "true"} if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://") else {}
    )
    return uri, options or None


def delta_table(path: str, *, writing: bool = False, why: str) -> Any:
    """delta-rs's table at ``path`` (None when there is none yet); ``why``: what needs it, for
    the message when ``deltalake`` is not installed."""
    try:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
    except ImportError:
        raise ImportError(
            f"{why} needs the deltalake package (pip install 'airflow-provider-kafka-backpressure[delta]')"
        ) from None
    uri, options = delta_rs_location(path)
    if writing and uri.startswith("s3://"):
        # the ledger's lock of the table makes this the table's only writer (module doc)
        options = {**(options or {}), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    try:
        return DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None


def add_actions(table: Any) -> list[dict[str, Any]]:
    """The table's live files (delta-rs's add actions, partition values flattened) as rows."""
    import pyarrow as pa

    return pa.table(table.get_add_actions(flatten=True)).to_pylist()
