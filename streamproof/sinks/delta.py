"""Delta Lake sink, append mode, wired for the pipeline's guarantee (:mod:`streamproof.guarantees`).

Idempotency rule (exactly-once), stated once: every batch is written with Delta's SetTransaction
``(txnAppId = "streamproof/<pipeline>", txnVersion = <batch id>)``. Delta records the highest version
per appId in the table's log, in the same atomic commit as the data, and skips a write whose version is
not higher. So a batch replayed after a crash (Spark re-runs the batch id it logged but did not commit)
writes nothing the second time, and a crash before the commit leaves only unreferenced files that
readers never see. The quarantine table is written the same way, before the main table.

Under at-least-once the same writes carry no transaction id (a replayed batch is appended again), and
under at-most-once the batch's offsets are marked done in a progress file before anything is written.

Each commit also carries ``userMetadata`` = ``{"streamproof": {"pipeline", "batch_id", "end_offsets"}}``:
the source offsets the table holds up to, used to detect and recover a lost checkpoint, and by the
harness to see on disk which batches reached the table.

Example (inside your own ``foreachBatch``)::

    >>> sink = DeltaSink(spec)                                                # doctest: +SKIP
    >>> query = parsed.writeStream.foreachBatch(sink.write_batch).start()    # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamproof import faults
from streamproof.checkpoint import ProgressFile, batch_end_offsets, is_empty
from streamproof.config import PipelineSpec
from streamproof.errors import PipelineError
from streamproof.guarantees import wiring_for
from streamproof.transform import REJECT_REASON, quarantined_records, valid_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class BatchResult:
    batch_id: int
    rows_out: int
    quarantined: int
    replay_skipped: bool = False  # a replayed batch the sink already held: Delta wrote nothing


def app_id(pipeline: str) -> str:
    """Delta SetTransaction appId of a pipeline: stable across restarts of the same pipeline."""
    return f"streamproof/{pipeline}"


class DeltaSink:
    """Writes parsed batches: valid records to the sink table, invalid ones to the quarantine table."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.app_id = app_id(spec.name)
        self.wiring = wiring_for(spec.guarantee)
        self.progress = ProgressFile(spec.checkpoint_dir) if self.wiring.progress_before_write else None
        self.results: dict[int, BatchResult] = {}
        self._first_batch_of_run = True

    def _append(self, frame: DataFrame, path: str, batch_id: int, metadata: str) -> None:
        writer = frame.write.format("delta").mode("append").option("userMetadata", metadata)
        if self.wiring.idempotent_sink:
            writer = writer.option("txnAppId", self.app_id).option("txnVersion", batch_id)
        writer.save(path)

    def write_batch(self, parsed: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` function: write one batch as the guarantee says (see the module docstring)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        faults.batch_starting(batch_id)
        end_offsets = batch_end_offsets(self.spec.checkpoint_dir, batch_id)
        if self.progress is not None:
            self.progress.mark_done(end_offsets, batch_id)  # at-most-once: done before written
        replay_skipped = self._already_written(batch_id, end_offsets)
        faults.reached(faults.BEFORE_SINK_WRITE, batch_id)
        metadata = json.dumps(
            {"streamproof": {"pipeline": self.spec.name, "batch_id": batch_id, "end_offsets": end_offsets}},
            sort_keys=True,
        )
        # Two writes read the batch: cache it so Kafka is fetched and JSON parsed once.
        parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK_DESER)
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
        faults.kill_when_batch_committed(batch_id, self.spec.checkpoint_dir / "commits" / str(batch_id))
        rows_out = 0 if replay_skipped else counts.get(True, 0)
        self.results[batch_id] = BatchResult(batch_id, rows_out, quarantined, replay_skipped)

    def _already_written(self, batch_id: int, end_offsets: dict[str, dict[str, int]]) -> bool:
        """True for a replayed batch the sink table already committed (so Delta's txn check skips it).

        Only the first batch of a run can be a replay, so the log is read once per run, not per batch.
        """
        if not self._first_batch_of_run or not self.wiring.idempotent_sink:
            return False
        self._first_batch_of_run = False
        return any(
            commit["batch_id"] == batch_id and commit["end_offsets"] == end_offsets and commit["txn"]
            for commit in commits_on_disk(self.spec.sink_path, self.spec.name)
        )


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
    """Refuse to start an exactly-once pipeline whose checkpoint is empty while its sink holds its batches.

    With a stable appId, a fresh checkpoint would number batches from 0 again and Delta would skip them
    as already written: silent loss. (Delta's own sink uses a per-checkpoint id instead, which turns the
    same mistake into silent duplicates.) Neither is acceptable, so the start is refused.
    """
    if not wiring_for(spec.guarantee).idempotent_sink or not is_empty(spec.checkpoint_dir):
        return
    commits = pipeline_commits(spark, str(spec.sink_path), spec.name, limit=5)
    if commits:
        last = commits[0]
        raise PipelineError(
            f"checkpoint {spec.checkpoint_dir} is empty but {spec.sink_path} already holds batches of "
            f"pipeline {spec.name!r} up to batch {last['batch_id']} (offsets {json.dumps(last['end_offsets'])}): "
            "the checkpoint was lost; restore it, or write to a new sink path"
        )


def commits_on_disk(table_path: Path, pipeline: str) -> list[dict[str, Any]]:
    """Every commit of ``pipeline`` in the table's log: ``{"version", "batch_id", "end_offsets", "txn"}``.

    Reads the ``_delta_log/*.json`` commit files directly (no Spark), so the harness can check right after
    a SIGKILL, before any restart, which batches reached the table and whether they carry the txn id.
    """
    commits: list[dict[str, Any]] = []
    log = table_path / "_delta_log"
    if not log.is_dir():
        return commits
    for commit_file in sorted(log.glob("[0-9]*.json")):
        txn_versions, record = set(), None
        for line in commit_file.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "txn" in action and action["txn"].get("appId") == app_id(pipeline):
                txn_versions.add(int(action["txn"]["version"]))
            elif "commitInfo" in action:
                metadata = json.loads(action["commitInfo"].get("userMetadata") or "{}").get("streamproof") or {}
                if metadata.get("pipeline") == pipeline:
                    record = metadata
        if record is not None:
            commits.append(
                {
                    "version": int(commit_file.stem),
                    "batch_id": int(record["batch_id"]),
                    "end_offsets": record["end_offsets"],
                    "txn": int(record["batch_id"]) in txn_versions,
                }
            )
    return commits
