"""Spark's streaming checkpoint: read the offset log (written before a batch runs) and the commit log
(written after it succeeds); back it up, restore it, and rebuild a lost one from the sinks' records.

Invariant used everywhere in streamproof: batch N is *in flight* when ``offsets/N`` exists and
``commits/N`` does not; on restart Spark re-runs exactly that offset range with the same batch id.

Example::

    >>> logged_batches(".streamproof/checkpoints/orders")      # doctest: +SKIP
    [0, 1, 2, 3]
    >>> committed_batches(".streamproof/checkpoints/orders")   # doctest: +SKIP
    [0, 1, 2]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from streamproof.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamproof.config import PipelineSpec


def _batch_files(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(f.name) for f in folder.iterdir() if f.name.isdigit())


def logged_batches(checkpoint: str | Path) -> list[int]:
    """Batch ids present in the offset log."""
    return _batch_files(Path(checkpoint) / "offsets")


def committed_batches(checkpoint: str | Path) -> list[int]:
    """Batch ids present in the commit log."""
    return _batch_files(Path(checkpoint) / "commits")


def is_empty(checkpoint: str | Path) -> bool:
    """True when no batch was ever planned in this checkpoint (a fresh or lost checkpoint)."""
    return not logged_batches(checkpoint)


FILE_LOG = "_file_source_log"  # batch_end_offsets' key for a file source's position (its log entry)
DELTA_LOG = "_delta_source_version"  # batch_end_offsets' key for a Delta source's position (version, file index)


def batch_end_offsets(checkpoint: str | Path, batch_id: int) -> dict[str, dict[str, int]]:
    """End offsets of a batch as logged by Spark: ``{topic: {partition: offset}}`` of the first source.

    The file is ``v1``, one line of batch metadata, then one JSON line per source.
    """
    path = Path(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PipelineError(f"{path}: no offset log entry for batch {batch_id}") from None
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise PipelineError(f"{path}: offset log entry is truncated or not Spark's format")
    try:
        offsets = json.loads(lines[2])
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path}: offset log entry is not valid JSON ({error})") from None
    if isinstance(offsets.get("logOffset"), int):  # a file source: the batch is entry N of its own file log
        return {FILE_LOG: {"logOffset": int(offsets["logOffset"])}}
    if isinstance(offsets.get("reservoirVersion"), int):  # a Delta source: table version and index of its files
        return {DELTA_LOG: {"reservoirVersion": int(offsets["reservoirVersion"]), "index": int(offsets["index"])}}
    return {topic: {str(p): int(o) for p, o in parts.items()} for topic, parts in offsets.items()}


def batch_watermark_ms(checkpoint: str | Path, batch_id: int) -> int:
    """The event-time watermark Spark logged for a batch (``batchWatermarkMs``, 0 before any watermark)."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    try:
        metadata_line = path.read_text(encoding="utf-8").splitlines()[1]
        return int(json.loads(metadata_line).get("batchWatermarkMs", 0))
    except FileNotFoundError:
        raise PipelineError(f"{path}: no offset log entry for batch {batch_id}") from None
    except (IndexError, ValueError, AttributeError) as error:
        raise PipelineError(f"{path}: offset log entry is truncated or not Spark's format ({error})") from None


def late_event_watermark_ms(checkpoint: str | Path, batch_id: int) -> int:
    """The watermark against which Spark's stateful operators judge the late records of ``batch_id``: the one
    of the batch before (Spark's ``getInputWatermarkForLateEvents(batchId - 1)``); 0 for the first batch.

    The offset log is written before a batch runs and never rewritten, so a replayed batch gets the same value.
    """
    return 0 if batch_id == 0 else batch_watermark_ms(checkpoint, batch_id - 1)


class ProgressFile:
    """At-most-once progress: the end offsets of the last batch marked done *before* it was written.

    Kept beside Spark's logs in the checkpoint folder; every start of an at-most-once pipeline wipes
    Spark's logs (so nothing is replayed) and starts reading from these offsets.

    Example::

        >>> progress = ProgressFile(Path("/tmp/cp"))                  # doctest: +SKIP
        >>> progress.mark_done({"orders": {"0": 120, "1": 98}})     # doctest: +SKIP
        >>> progress.starting_offsets()                              # doctest: +SKIP
        '{"orders": {"0": 120, "1": 98}}'
    """

    NAME = "_streamproof_progress.json"

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.path = checkpoint / self.NAME

    def starting_offsets(self) -> str | None:
        """Spark ``startingOffsets`` JSON of the last batch marked done, or None before the first batch."""
        if not self.path.exists():
            return None
        try:
            return json.dumps(json.loads(self.path.read_text())["end_offsets"], sort_keys=True)
        except (json.JSONDecodeError, KeyError) as error:
            raise PipelineError(
                f"{self.path}: unreadable at-most-once progress ({error}); "
                "delete it to restart from source.starting_offsets"
            ) from None

    def mark_done(self, end_offsets: dict[str, dict[str, int]], batch_id: int) -> None:
        """Durably record the batch as done (write, fsync, atomic rename)."""
        import os

        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"batch_id": batch_id, "end_offsets": end_offsets}, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    def wipe_spark_logs(self) -> None:
        """Delete Spark's logs in the checkpoint (not the progress): the next start replays nothing."""
        import shutil

        if not self.checkpoint.exists():
            return
        for entry in self.checkpoint.iterdir():
            if entry.name.startswith("_streamproof"):  # this progress, the run lock, the run counter
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def next_batch_to_run(checkpoint: str | Path) -> int:
    """The batch id a (re)start of the query will execute first.

    The batch logged but not committed (replayed), else the one after the last committed, else 0.

    >>> next_batch_to_run("/nonexistent")
    0
    """
    logged, committed = logged_batches(checkpoint), committed_batches(checkpoint)
    if logged and logged[-1] not in committed:
        return logged[-1]
    return committed[-1] + 1 if committed else 0


def check_readable(checkpoint: str | Path, recover_hint: str) -> None:
    """Fail with one clear line when the last offset or commit log entry is damaged (truncated, not JSON).

    Spark would stop on it with a JVM stack trace; this names the file and the way out.
    """
    folder = Path(checkpoint)
    for log, batches in (("offsets", logged_batches(folder)), ("commits", committed_batches(folder))):
        if not batches:
            continue
        path = folder / log / str(batches[-1])
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        expected = 3 if log == "offsets" else 2
        try:
            if len(lines) < expected or not lines[0].startswith("v"):
                raise ValueError("truncated")
            for line in lines[1:expected]:
                if line.strip() != "-":
                    json.loads(line)
        except ValueError as error:
            raise PipelineError(
                f"{path} is damaged ({error}): restore a backup (`streamproof checkpoint restore`) or rebuild the "
                f"checkpoint from the offsets the sinks recorded ({recover_hint})"
            ) from None


class RunLock:
    """``<checkpoint>/_streamproof_run.pid`` while a pipeline runs on the checkpoint: a second run, a
    backup or a restore is refused while the process that holds it is alive (a stale file is ignored).

    Example::

        >>> with RunLock(Path(".streamproof/checkpoints/orders")):   # doctest: +SKIP
        ...     run_the_query()
    """

    NAME = "_streamproof_run.pid"

    def __init__(self, checkpoint: Path) -> None:
        self.path = checkpoint / self.NAME

    def holder(self) -> int | None:
        """Pid of a live process holding the lock, else None."""
        import os

        try:
            pid = int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid if pid != os.getpid() else None

    def __enter__(self) -> RunLock:
        import os

        holder = self.holder()
        if holder is not None:
            raise PipelineError(f"{self.path.parent} is in use by a running pipeline (pid {holder}); stop it first")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


def _refuse_while_running(checkpoint: Path, action: str) -> None:
    holder = RunLock(checkpoint).holder()
    if holder is not None:
        raise PipelineError(
            f"cannot {action} {checkpoint} while a pipeline runs on it (pid {holder}): stop it first (SIGTERM "
            "stops it after the batch in flight), so that the copy is consistent"
        )


def backup(checkpoint: Path, target: Path | None = None) -> Path:
    """Copy the checkpoint (not while a pipeline runs on it) to ``target`` (default: a stamped sibling)."""
    import shutil
    import time

    if not checkpoint.is_dir():
        raise PipelineError(f"{checkpoint}: no checkpoint to back up")
    _refuse_while_running(checkpoint, "back up")
    target = target or checkpoint.with_name(f"{checkpoint.name}.backup-{time.strftime('%Y%m%dT%H%M%S')}")
    if target.exists():
        raise PipelineError(f"{target} exists already: choose another backup path")
    shutil.copytree(checkpoint, target, ignore=shutil.ignore_patterns(RunLock.NAME))
    return target


def restore(checkpoint: Path, source: Path) -> Path | None:
    """Replace the checkpoint by the backup ``source``; the current one is kept aside (returned).

    Restoring an older backup is safe with streamproof's sinks: the batches the sinks hold beyond it are
    replayed with the same ids and offsets, and each keyed sink skips them.
    """
    import shutil
    import time

    if not (source / "offsets").is_dir():
        raise PipelineError(f"{source}: not a checkpoint backup (no offsets/ folder)")
    _refuse_while_running(checkpoint, "restore")
    aside = None
    if checkpoint.exists():
        aside = checkpoint.with_name(f"{checkpoint.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
        checkpoint.rename(aside)
    shutil.copytree(source, checkpoint)
    return aside


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


def rebuild(
    checkpoint: Path,
    end_offsets: dict[int, dict[str, dict[str, int]]],
    committed_through: int,
    confs: dict[str, str] | None = None,
) -> None:
    """Write a fresh checkpoint whose offset log holds ``end_offsets`` (batch id -> offsets) and whose commit
    log says batches up to ``committed_through`` are done.

    The offsets keep the key order they were recorded in (Spark's): Spark numbers a Kafka batch's partitions
    in that order, and per-partition sinks key their commits on the partition number.

    Spark resumes such a checkpoint at the first uncommitted batch, re-running a logged one with exactly its
    logged offsets (it needs the entry before the newest one too, as the newest batch's start): the batch
    ids continue where the sinks are, so every sink's (pipeline, batch id) key keeps skipping what it holds.
    Format: Spark's offset log ``v1`` / batch metadata / one offsets line per source, and commit log ``v1`` /
    watermark; ``metadata`` holds a new query id (Spark requires the file).
    """
    import uuid

    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}), encoding="utf-8")
    for batch_id, offsets in sorted(end_offsets.items()):
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": confs or {}}
        (checkpoint / "offsets" / str(batch_id)).write_text(
            f"v1\n{json.dumps(metadata)}\n{json.dumps(offsets)}", encoding="utf-8"
        )
        if batch_id <= committed_through:
            (checkpoint / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}', encoding="utf-8")


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
    import time

    from streamproof.guarantees import wiring_for
    from streamproof.sinks.base import open_sinks

    if not wiring_for(spec.guarantee).idempotent_sink:
        raise PipelineError(
            f"checkpoint recover applies to exactly-once pipelines (their sinks record the offsets of each batch); "
            f"a {spec.guarantee} pipeline restarts from source.starting_offsets with a fresh checkpoint"
        )
    checkpoint = spec.checkpoint_dir
    _refuse_while_running(checkpoint, "recover")
    if not is_empty(checkpoint) and _is_readable(checkpoint):
        raise PipelineError(
            f"{checkpoint} is intact (batches {logged_batches(checkpoint)[-1]} logged): recover is for a lost or "
            "damaged checkpoint; to go back to a backup use `streamproof checkpoint restore`"
        )
    sinks = open_sinks(spec)
    heads = {sink.name: sink.last_commit(spark) for sink in sinks}
    # A batch some partitions of which committed (a crash inside a per-partition sink's write) is ahead.
    partial = [c.batch_id for sink in sinks for c in sink.commits() if not c.complete]
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
        for sink in sinks
        for commit in sink.commits()
        if commit.end_offsets is not None
    }
    needed = sorted({batch for batch in (low - 1, low, high) if batch >= 0})
    missing = [batch for batch in needed if batch not in recorded]
    if missing:
        raise PipelineError(
            f"no sink recorded the end offsets of batch(es) {missing} (a Parquet folder does not): restore a "
            "checkpoint backup instead"
        )
    aside = None
    if checkpoint.exists() and not is_empty(checkpoint):
        aside = checkpoint.with_name(f"{checkpoint.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        checkpoint.rename(aside)
    elif checkpoint.exists():  # only streamproof's own files (run counter): not worth keeping
        import shutil

        shutil.rmtree(checkpoint)
    entries = {batch: recorded[batch] for batch in needed}
    rebuild(checkpoint, entries, committed_through=low, confs=recorded_confs(spark))
    resume = f"re-runs batch {high} with the offsets recorded by the sinks ahead" if high > low else (
        f"continues with batch {high + 1}")  # fmt: skip
    kept = f"; the damaged checkpoint is kept as {aside}" if aside else ""
    return (
        f"rebuilt {checkpoint} from the sinks' records (each sink's last batch: {positions}); the next run {resume}, "
        f"from offsets {json.dumps(recorded[low] if low >= 0 else recorded[high])}{kept}"
    )


def _is_readable(checkpoint: Path) -> bool:
    try:
        check_readable(checkpoint, "")
    except PipelineError:
        return False
    return True
