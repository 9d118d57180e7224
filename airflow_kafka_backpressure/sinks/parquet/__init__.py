"""The Parquet directory (:class:`~.sink.ParquetSink`, ``sink_format: "parquet"``): one directory of
Parquet files per batch, written into a staging directory and swapped in whole (:mod:`.write`,
:mod:`.commit`), fenced by the ledger's attempt number (:mod:`.fencing`), its manifest read back
where Spark runs (:mod:`.manifest`)."""

from .sink import ParquetSink

__all__ = ["ParquetSink"]
