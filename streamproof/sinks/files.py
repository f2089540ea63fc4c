"""Parquet folder sink: Spark's own file sink and its ``_spark_metadata`` log, driven from ``foreachBatch``.

Idempotency rule, stated once: a keyed batch is written by Spark's ``FileStreamSink``: the batch's files
are listed in ``_spark_metadata/<batch id>`` once they are all written (the log entry is the commit), and
a batch id not above the log's latest is skipped. Readers that honour the log (Spark's Parquet reader
does whenever ``_spark_metadata`` exists) see each batch exactly once; files of a batch killed before its
log entry are never read. The log is contiguous from batch 0, so its latest entry says which batches the
folder holds. Readers that list the folder's files themselves get no such guarantee.

Unkeyed writes (at-least-once, at-most-once) are plain Parquet appends to a folder without the log: a
replayed batch is appended again.

The sink is driven through Spark's JVM class (``sinks.FileStreamSink``) rather than
``writeStream.format("parquet")`` so that quarantine, fan-out and the crash points work as for every
other sink.

Example::

    >>> sink = FilesSink(spec, spec.sink_specs[0])                                 # doctest: +SKIP
    >>> sink.write(valid_rows, Batch("orders", 7, end_offsets, keyed=True))        # doctest: +SKIP
    SinkWrite(rows_out=16583, replay_skipped=False)
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import FilesSinkSpec
from streamproof.sinks.base import Batch, FolderSink, SinkCommit, SinkWrite

METADATA_DIR = "_spark_metadata"
FILE_STREAM_SINK = "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink"


class FilesSink(FolderSink):
    """Valid records to a Parquet folder (see the module docstring)."""

    kind = "files"
    spec: FilesSinkSpec

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        if not batch.keyed:
            rows.write.mode("append").parquet(str(self.path))
            return SinkWrite(batch.rows)
        latest = self.latest_logged_batch()  # the log records batch ids, not offsets: no foreign-checkpoint check
        if latest is not None and batch.batch_id <= latest:
            return SinkWrite(0, replay_skipped=True)
        self._file_stream_sink(rows.sparkSession).addBatch(batch.batch_id, rows._jdf)
        return SinkWrite(batch.rows)

    def _file_stream_sink(self, spark: SparkSession) -> Any:
        jvm = spark._jvm
        assert jvm is not None, "Spark's file sink is driven through the classic (JVM) session"
        parquet = jvm.org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat()
        no_partitions = jvm.PythonUtils.toSeq(jvm.java.util.ArrayList())
        no_options = jvm.PythonUtils.toScalaMap(jvm.java.util.HashMap())
        sink_class = getattr(jvm, FILE_STREAM_SINK)
        return sink_class(spark._jsparkSession, str(self.path), parquet, no_partitions, no_options)  # type: ignore[attr-defined]

    def latest_logged_batch(self) -> int | None:
        """The latest batch id in ``_spark_metadata`` (plain ``N`` or compacted ``N.compact`` entries)."""
        ids = [int(name.split(".")[0]) for name in (self.path / METADATA_DIR).names() if name.split(".")[0].isdigit()]
        return max(ids, default=None)

    head_meaning = "latest batch of its _spark_metadata log"

    def head(self) -> int:
        latest = self.latest_logged_batch()
        return -1 if latest is None else latest

    def commits(self) -> list[SinkCommit]:
        # The log does not record source offsets; it is contiguous from batch 0 to its latest entry.
        latest = self.latest_logged_batch()
        return [] if latest is None else [SinkCommit(batch_id, None, True) for batch_id in range(latest + 1)]

    def read(self, spark: SparkSession) -> DataFrame | None:
        if not any(name.endswith(".parquet") for name in self.path.names()):
            return None
        return spark.read.parquet(str(self.path))
