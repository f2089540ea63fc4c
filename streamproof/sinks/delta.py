"""Delta Lake sink, append mode, exactly-once.

Idempotency rule, stated once: every batch is written with Delta's SetTransaction
``(txnAppId = "streamproof/<pipeline>", txnVersion = <batch id>)``. Delta records the highest version
per appId in the table's log, in the same atomic commit as the data, and skips a write whose version is
not higher. So a batch replayed after a crash (Spark re-runs the batch id it logged but did not commit)
writes nothing the second time, and a crash before the commit leaves only unreferenced files that
readers never see. The quarantine table is written the same way, before the main table.

Each commit also carries ``userMetadata`` = ``{"streamproof": {"pipeline", "batch_id", "end_offsets"}}``:
the source offsets the table holds up to, used to detect and recover a lost checkpoint.

Example (inside your own ``foreachBatch``)::

    >>> sink = DeltaAppendSink(spec)                                          # doctest: +SKIP
    >>> query = parsed.writeStream.foreachBatch(sink.write_batch).start()    # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamproof import faults
from streamproof.checkpoint import batch_end_offsets, is_empty
from streamproof.config import PipelineSpec
from streamproof.errors import PipelineError
from streamproof.transform import REJECT_REASON, quarantined_records, valid_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class BatchResult:
    batch_id: int
    rows_out: int
    quarantined: int


def app_id(pipeline: str) -> str:
    """Delta SetTransaction appId of a pipeline: stable across restarts of the same pipeline."""
    return f"streamproof/{pipeline}"


class DeltaAppendSink:
    """Writes parsed batches: valid records to the sink table, invalid ones to the quarantine table."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.app_id = app_id(spec.name)
        self.results: dict[int, BatchResult] = {}

    def _metadata(self, batch_id: int) -> str:
        end_offsets = batch_end_offsets(self.spec.checkpoint_dir, batch_id)
        return json.dumps(
            {"streamproof": {"pipeline": self.spec.name, "batch_id": batch_id, "end_offsets": end_offsets}},
            sort_keys=True,
        )

    def _append(self, frame: DataFrame, path: str, batch_id: int, metadata: str) -> None:
        (
            frame.write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .option("userMetadata", metadata)
            .save(path)
        )

    def write_batch(self, parsed: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` function: write one batch exactly once (see the module docstring)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        faults.reached(faults.BEFORE_SINK_WRITE, batch_id)
        metadata = self._metadata(batch_id)
        # Two writes read the batch: cache it so Kafka is fetched and JSON parsed once.
        parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = {
                row["valid"]: row["count"]
                for row in parsed.groupBy(F.col(REJECT_REASON).isNull().alias("valid")).count().collect()
            }
            quarantined = counts.get(False, 0)
            if quarantined:
                self._append(quarantined_records(parsed), str(self.spec.quarantine_path), batch_id, metadata)
            faults.kill_when_write_job_runs(batch_id, parsed.sparkSession.sparkContext)
            self._append(valid_records(parsed), str(self.spec.sink_path), batch_id, metadata)
        finally:
            parsed.unpersist()
        faults.reached(faults.AFTER_SINK_COMMIT, batch_id)
        self.results[batch_id] = BatchResult(batch_id, counts.get(True, 0), quarantined)


def pipeline_commits(spark: SparkSession, table_path: str, pipeline: str, limit: int = 50) -> list[dict[str, Any]]:
    """The newest streamproof commit records of ``pipeline`` in a Delta table (newest first)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, table_path):
        return []
    history = DeltaTable.forPath(spark, table_path).history(limit).select("version", "userMetadata").collect()
    commits = []
    for row in history:
        try:
            record = json.loads(row["userMetadata"] or "{}").get("streamproof")
        except json.JSONDecodeError:
            continue
        if record and record.get("pipeline") == pipeline:
            commits.append({**record, "table_version": row["version"]})
    return commits


def refuse_if_checkpoint_lost(spark: SparkSession, spec: PipelineSpec) -> None:
    """Refuse to start when the checkpoint is empty but the sink already holds this pipeline's batches.

    With a stable appId, a fresh checkpoint would number batches from 0 again and Delta would skip them
    as already written: silent loss. (Delta's own sink uses a per-checkpoint id instead, which turns the
    same mistake into silent duplicates.) Neither is acceptable, so the start is refused.
    """
    if not is_empty(spec.checkpoint_dir):
        return
    commits = pipeline_commits(spark, str(spec.sink_path), spec.name, limit=5)
    if commits:
        last = commits[0]
        raise PipelineError(
            f"checkpoint {spec.checkpoint_dir} is empty but {spec.sink_path} already holds batches of "
            f"pipeline {spec.name!r} up to batch {last['batch_id']} (offsets {json.dumps(last['end_offsets'])}): "
            "the checkpoint was lost; restore it, or write to a new sink path"
        )
