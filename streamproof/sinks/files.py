"""Parquet folder sink: Spark's own file sink and its ``_spark_metadata`` log, driven from ``foreachBatch``.

Idempotency rule, stated once: a keyed batch is written by Spark's ``FileStreamSink``: the batch's files
are listed in ``_spark_metadata/<batch id>`` once they are all written (the log entry is the commit).
Readers that honour the log (Spark's Parquet reader does whenever ``_spark_metadata`` exists) see each batch
exactly once; files of a batch killed before its log entry are never read. The log is contiguous from batch
0, so its latest entry says which batches the folder holds. Readers that list the folder's files themselves get
no such guarantee. Spark's log records no source offsets: before the batch's files, its commit record (batch id
and end offsets) is written to ``_streamproof_batches/<batch id>.json`` (atomically; the last
:data:`BATCHES_KEPT` are kept), so the replay rule of :mod:`streamproof.sinks.base` compares a replay's offsets
with the ones the folder's batch was written with, as for every other sink. A record without its log entry is
an attempt that never committed (the next attempt rewrites it).

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

import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import FilesSinkSpec
from streamproof.sinks.base import OFFSETS_KEPT, Batch, FolderSink, SinkCommit, SinkWrite
from streamproof.storage.location import Location

METADATA_DIR = "_spark_metadata"
BATCHES_DIR = "_streamproof_batches"  # each keyed batch's commit record (Parquet readers skip "_" folders)
BATCHES_KEPT = OFFSETS_KEPT  # as many as Spark's offset log keeps: a replay further back than that is refused
FILE_STREAM_SINK = "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink"


class FilesSink(FolderSink):
    """Valid records to a Parquet folder (see the module docstring)."""

    kind = "files"
    spec: FilesSinkSpec

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        if not batch.keyed:
            rows.write.mode("append").parquet(str(self.path))
            return SinkWrite(batch.rows)
        if self.replay_check(batch):
            return SinkWrite(0, replay_skipped=True)
        records = self.path / BATCHES_DIR
        records.mkdir()
        (records / f"{batch.batch_id}.json").replace_with_text(json.dumps(batch.commit_record()))
        self._file_stream_sink(rows.sparkSession).addBatch(batch.batch_id, rows._jdf)
        (records / f"{batch.batch_id - BATCHES_KEPT}.json").delete()
        self.note_written(batch)
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
        # Spark's log is contiguous from batch 0 to its latest entry; the offsets come from the batches' records.
        return list(self.held_from(0).values())

    def held_from(self, first_batch: int) -> dict[int, SinkCommit]:
        """The batches from ``first_batch`` in Spark's log, each with the end offsets its record holds (None for a
        batch whose record is gone: older than the last :data:`BATCHES_KEPT`, or written before they were kept)."""
        latest = self.latest_logged_batch()
        if latest is None:
            return {}
        records = self.path / BATCHES_DIR
        kept = {int(name[:-5]) for name in records.names() if name.endswith(".json") and name[:-5].isdigit()}
        held = {}
        for batch in range(max(first_batch, 0), latest + 1):
            record = _record(records, batch) if batch in kept else {}
            held[batch] = SinkCommit(
                batch,
                record.get("end_offsets"),
                True,
                quarantined=record.get("quarantined"),
                start_offsets=record.get("start_offsets"),
            )
        return held

    def read(self, spark: SparkSession) -> DataFrame | None:
        if not any(name.endswith(".parquet") for name in self.path.names()):
            return None
        return spark.read.parquet(str(self.path))


def _record(records: Location, batch_id: int) -> dict[str, Any]:
    """A batch's commit record (empty when it is gone or unreadable)."""
    try:
        record = json.loads((records / f"{batch_id}.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
