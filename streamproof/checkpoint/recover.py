"""The checkpoint against the sinks: refuse to start on a lost checkpoint, and rebuild it from the end offsets
the sinks recorded with each batch (``streamproof checkpoint recover``).

Every keyed sink commit records its batch id and end offsets (:meth:`streamproof.sinks.base.Batch.commit_record`):
the sinks know where the pipeline was even when the checkpoint is gone.

Example::

    >>> print(recover(spark, load_pipeline("orders.toml")))                 # doctest: +SKIP
    rebuilt .../checkpoints/orders from the sinks' records (each sink's last batch: {'delta': 7}); ...
"""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from streamproof.checkpoint.copies import aside, held_by_command
from streamproof.checkpoint.folder import RunLock
from streamproof.checkpoint.log import check_readable, is_empty, logged_batches, rebuild
from streamproof.checkpoint.start import SinksAtStart
from streamproof.config import PipelineSpec
from streamproof.errors import PipelineError
from streamproof.sinks import open_sinks
from streamproof.sinks.base import Sink, SinkCommit, recording
from streamproof.sinks.delta import DeltaSink, QuarantineTable
from streamproof.sinks.delta_log import batches_back_to, latest_version
from streamproof.sinks.python import PythonSink
from streamproof.storage.location import Location

# The session confs Spark records in each offset log entry (Spark 4.2), which it restores on restart so that
# state written under them stays readable; a rebuilt entry carries the session's current values.
RECORDED_CONFS = (
    "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion",
    "spark.sql.streaming.stateStore.rocksdb.formatVersion",
    "spark.sql.streaming.queryEvolution.enableSourceEvolution",
    "spark.sql.streaming.stateStore.encodingFormat",
    "spark.sql.streaming.statefulOperator.useStrictDistribution",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion",
    "spark.sql.streaming.multipleWatermarkPolicy",
    "spark.sql.streaming.stateStore.rowChecksum.enabled",
    "spark.sql.streaming.aggregation.stateFormatVersion",
    "spark.sql.function.protobufExtensions.enabled",
    "spark.sql.shuffle.partitions",
    "spark.sql.streaming.join.stateFormatVersion",
    "spark.sql.streaming.stateStore.compression.codec",
    "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan",
)


def recorded_confs(spark: SparkSession) -> dict[str, str]:
    """The session's values of :data:`RECORDED_CONFS` (those it knows)."""
    values = {}
    for key in RECORDED_CONFS:
        try:
            value = spark.conf.get(key)  # the conf's default when the session does not set it
        except Exception:  # a conf this Spark does not know: nothing to record
            continue
        if value is not None:
            values[key] = value
    return values


def recover(spark: SparkSession, spec: PipelineSpec) -> str:
    """Rebuild a lost or damaged checkpoint of an exactly-once pipeline from the offsets its sinks recorded.

    Every keyed sink commit records its batch id and end offsets. The sinks of one pipeline are at most one
    batch apart (a crash between two sinks of a fan-out), so the rebuilt checkpoint marks the lowest
    sink's batch committed and, when another sink is one batch ahead, logs that batch with the offsets
    that sink recorded: Spark re-runs it with the same range, the sinks that hold it skip it, the others
    write it. A damaged checkpoint is kept aside, never deleted. Returns what was done, in one line.
    """
    if spec.source.kind != "kafka":
        raise PipelineError(
            f"checkpoint recover rebuilds Kafka offsets from the sinks' records; a {spec.source.kind} source's "
            "position is Spark's own file log: restore a backup (`streamproof checkpoint restore`) instead"
        )
    if not spec.wiring.idempotent_sink:
        raise PipelineError(
            f"checkpoint recover applies to exactly-once pipelines (their sinks record the offsets of each batch); "
            f"a {spec.guarantee} pipeline restarts from source.starting_offsets with a fresh checkpoint"
        )
    if spec.transform.watermark is not None:
        raise PipelineError(
            "checkpoint recover rebuilds the offset and commit logs from the sinks' records, not the state of dedup "
            "or windows, which only the checkpoint holds (resent records seen before would pass again): restore a "
            f"checkpoint backup (`streamproof checkpoint restore {spec._source_name} --from BACKUP`) instead"
        )
    with held_by_command(spec.checkpoint_dir, "recover", "checkpoint recover") as lock:
        return _recover_held(spark, spec, lock)


def _recover_held(spark: SparkSession, spec: PipelineSpec, lock: RunLock) -> str:
    """:func:`recover` under the run lock, which the rebuilt checkpoint folder takes over."""
    checkpoint = spec.checkpoint_dir
    if not is_empty(checkpoint) and _is_readable(checkpoint):
        raise PipelineError(
            f"{checkpoint} is intact (batches {logged_batches(checkpoint)[-1]} logged): recover is for a lost or "
            "damaged checkpoint; to go back to a backup use `streamproof checkpoint restore`"
        )
    sinks = recording(open_sinks(spec))
    heads = {sink.name: sink.last_commit(spark) for sink in sinks}
    # What each sink holds from the batch before the lowest last one on: the records a rebuild needs, read from the
    # newest commits only (a Delta log's older ones are never read).
    floor = max(min((head.batch_id if head else -1 for head in heads.values()), default=-1) - 1, 0)
    held = [_records_from(sink, floor) for sink in sinks]
    # A batch some partitions of which committed (a crash inside a per-partition sink's write) is ahead.
    partial = [commit.batch_id for holds in held for commit in holds.values() if not commit.complete]
    if all(head is None for head in heads.values()) and not partial:
        raise PipelineError(
            f"no sink holds a batch of pipeline {spec.name!r}: nothing to recover from; remove {checkpoint} and "
            "start afresh"
        )
    positions = {name: (head.batch_id if head else -1) for name, head in heads.items()}
    low, high = min(positions.values()), max([*positions.values(), *partial])
    if high - low > 1:
        raise PipelineError(
            f"the sinks are more than one batch apart ({positions}): they were not written by this pipeline alone; "
            "restore a checkpoint backup instead"
        )
    recorded = {
        commit.batch_id: commit.end_offsets
        for holds in held
        for commit in holds.values()
        if commit.end_offsets is not None
    }
    needed = sorted({batch for batch in (low - 1, low, high) if batch >= 0})
    missing = [batch for batch in needed if batch not in recorded]
    if missing:
        raise PipelineError(
            f"no sink recorded the end offsets of batch(es) {missing} (a Parquet folder keeps them for its last 100 "
            "batches only): restore a checkpoint backup instead"
        )
    # A folder with only streamproof's own files (run counter, the lock) is not worth keeping.
    kept = aside(checkpoint, "damaged") if not is_empty(checkpoint) else None
    entries = {batch: recorded[batch] for batch in needed}
    confs = recorded_confs(spark)
    lock.replace_folder(lambda staging: rebuild(staging, entries, committed_through=low, confs=confs), kept)
    resume = (
        f"re-runs batch {high} with the offsets recorded by the sinks ahead"
        if high > low
        else (f"continues with batch {high + 1}")
    )
    kept_text = f"; the damaged checkpoint is kept as {kept}" if kept else ""
    return (
        f"rebuilt {checkpoint} from the sinks' records (each sink's last batch: {positions}); the next run {resume}, "
        f"from offsets {json.dumps(recorded[low] if low >= 0 else recorded[high])}{kept_text}"
    )


def _records_from(sink: Sink, first_batch: int) -> dict[int, SinkCommit]:
    """The sink's records of its batches from ``first_batch`` on, as many as it still holds: a Delta table's commit
    files may be cleaned up behind a Delta checkpoint, and another sink may hold the record instead (the rebuild
    names what none holds)."""
    if isinstance(sink, DeltaSink):
        return batches_back_to(sink.path, sink.pipeline.name, latest_version(sink.path), first_batch).commits
    return sink.held_from(first_batch)


def _is_readable(checkpoint: Location) -> bool:
    try:
        check_readable(checkpoint, "")
    except PipelineError:
        return False
    return True


def refuse_if_checkpoint_lost(pipeline: PipelineSpec, held: SinksAtStart) -> None:
    """Refuse to start an exactly-once pipeline whose checkpoint is empty while a sink holds its batches.

    A fresh checkpoint numbers batches from 0 again: keyed sinks would skip them as already written
    (silent loss), and Delta's own streaming sink, keyed on the checkpoint's query id, would write them
    again (silent duplicates). Neither is acceptable, so the start is refused, naming what the sink holds.

    >>> refuse_if_checkpoint_lost(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))  # doctest: +SKIP
    PipelineError: checkpoint ... is empty but /data/orders already holds batches of pipeline 'orders' up to batch 6 ...
    """
    start = held.start
    if not start.wiring.idempotent_sink or start.logs.logged:
        return
    # Your own sinks by the batches handed to them, and the quarantine table, which a batch writes before the sinks;
    # one not read yet (through Spark's JVM only) is judged once Spark runs.
    for table in held.tables:
        last = table.last_record.get() if table.last_record is not None else None
        if last is None:
            continue
        sink = table.sink
        offsets = "" if last.end_offsets is None else f" (offsets {json.dumps(last.end_offsets)})"
        recover = f"`streamproof checkpoint recover {pipeline._source_name}`"
        if isinstance(sink, PythonSink):
            raise PipelineError(
                f"checkpoint {pipeline.checkpoint_dir} is empty but your sink {sink.name} ({sink.location}) was "
                f"handed batches of pipeline {pipeline.name!r} up to batch {last.batch_id}{offsets}, recorded in "
                f"{sink.handed.folder}: the checkpoint was lost, and a new one would hand it those batch ids again "
                f"with other records; rebuild it from the records ({recover}), restore a backup, or, to start your "
                f"sink afresh, empty it and remove {sink.handed.folder}"
            )
        quarantine = isinstance(sink, QuarantineTable)
        what = sink.called if quarantine else sink.location
        fresh = f"move {pipeline.quarantine_path} aside to start afresh" if quarantine else "write to a new sink"
        raise PipelineError(
            f"checkpoint {pipeline.checkpoint_dir} is empty but {what} already holds batches of "
            f"pipeline {pipeline.name!r} up to batch {last.batch_id}{offsets}: the checkpoint was lost; "
            f"rebuild it from the sinks' records ({recover}), restore a backup, or {fresh}"
        )
