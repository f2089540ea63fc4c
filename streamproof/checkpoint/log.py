"""Spark's streaming checkpoint logs: the offset log (written before a batch runs) and the commit log
(written after it succeeds); read here, and written anew by :func:`rebuild`.

Invariant used everywhere in streamproof: batch N is *in flight* when ``offsets/N`` exists and
``commits/N`` does not; on restart Spark re-runs exactly that offset range with the same batch id.

Example::

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> rebuild(checkpoint, {0: {"orders": {"0": 10}}, 1: {"orders": {"0": 25}}}, committed_through=0)
    >>> logged_batches(checkpoint), committed_batches(checkpoint), next_batch_to_run(checkpoint)
    ([0, 1], [0], 1)
    >>> batch_end_offsets(checkpoint, 1)
    {'orders': {'0': 25}}
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from streamproof.errors import PipelineError
from streamproof.storage.location import Location

Checkpoint = str | Path | Location  # a local folder or a URI (hdfs://, s3a://, ...)


def _at(checkpoint: Checkpoint) -> Location:
    return checkpoint if isinstance(checkpoint, Location) else Location(checkpoint)


def _batch_files(folder: Location) -> list[int]:
    return _batch_ids(folder.names())


def _batch_ids(names: list[str]) -> list[int]:
    # Hadoop's checksum files (".0.crc") and Spark's temporary files are not batch entries.
    return sorted(int(name) for name in names if name.isdigit())


def logged_batches(checkpoint: Checkpoint) -> list[int]:
    """Batch ids present in the offset log."""
    return _batch_files(_at(checkpoint) / "offsets")


def committed_batches(checkpoint: Checkpoint) -> list[int]:
    """Batch ids present in the commit log."""
    return _batch_files(_at(checkpoint) / "commits")


@dataclass(frozen=True)
class Logs:
    """The batch ids in the offset log and in the commit log, each listed once (:func:`read_logs`), and the checksum
    files that stayed when the entry beside them was deleted (``offsets/.3.crc`` without ``offsets/3``)."""

    logged: list[int]
    committed: list[int]
    stray_checksums: tuple[str, ...] = ()


def read_logs(checkpoint: Checkpoint) -> Logs:
    """Both logs, listed once.

    >>> read_logs("/nonexistent")
    Logs(logged=[], committed=[], stray_checksums=())
    """
    folder = _at(checkpoint)
    listed = {log: (folder / log).names() for log in ("offsets", "commits")}
    strays = tuple(
        f"{log}/{name}"
        for log, names in listed.items()
        for name in names
        if name.startswith(".") and name.endswith(".crc") and name[1:-4].isdigit() and name[1:-4] not in names
    )
    return Logs(_batch_ids(listed["offsets"]), _batch_ids(listed["commits"]), strays)


def is_empty(checkpoint: Checkpoint) -> bool:
    """True when no batch was ever planned in this checkpoint (a fresh or lost checkpoint)."""
    return not logged_batches(checkpoint)


DONE = 'v1\n{"nextBatchWatermarkMs":0}'  # a commit log entry as Spark writes it after a stateless batch
FILE_LOG = "_file_source_log"  # batch_end_offsets' key for a file source's position (its log entry)
DELTA_LOG = "_delta_source_version"  # batch_end_offsets' key for a Delta source's position (version, file index)


def batch_end_offsets(checkpoint: Checkpoint, batch_id: int) -> dict[str, dict[str, int]]:
    """End offsets of a batch as logged by Spark: ``{topic: {partition: offset}}`` of the first source.

    The file is ``v1``, one line of batch metadata, then one JSON line per source.
    """
    path = _at(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
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


def batch_start_offsets(checkpoint: Checkpoint, batch_id: int) -> dict[str, dict[str, int]] | None:
    """Where a batch starts: the end offsets of the batch before it (None for batch 0, or when the offset log no
    longer holds that one: Spark keeps the last 100).

    >>> batch_start_offsets("/nonexistent", 0) is None
    True
    """
    if batch_id == 0:
        return None
    try:
        return batch_end_offsets(checkpoint, batch_id - 1)
    except PipelineError:
        return None


def batch_watermark_ms(checkpoint: Checkpoint, batch_id: int) -> int:
    """The event-time watermark Spark logged for a batch (``batchWatermarkMs``, 0 before any watermark)."""
    path = _at(checkpoint) / "offsets" / str(batch_id)
    try:
        metadata_line = path.read_text().splitlines()[1]
        return int(json.loads(metadata_line).get("batchWatermarkMs", 0))
    except FileNotFoundError:
        raise PipelineError(f"{path}: no offset log entry for batch {batch_id}") from None
    except (IndexError, ValueError, AttributeError) as error:
        raise PipelineError(f"{path}: offset log entry is truncated or not Spark's format ({error})") from None


def late_event_watermark_ms(checkpoint: Checkpoint, batch_id: int) -> int:
    """The watermark against which Spark's stateful operators judge the late records of ``batch_id``: the one
    of the batch before (Spark's ``getInputWatermarkForLateEvents(batchId - 1)``); 0 for the first batch.

    The offset log is written before a batch runs and never rewritten, so a replayed batch gets the same value.
    """
    return 0 if batch_id == 0 else batch_watermark_ms(checkpoint, batch_id - 1)


def next_batch_to_run(checkpoint: Checkpoint) -> int:
    """The batch id a (re)start of the query will execute first.

    The batch logged but not committed (replayed), else the one after the last committed, else 0.

    >>> next_batch_to_run("/nonexistent")
    0
    """
    logged, committed = logged_batches(checkpoint), committed_batches(checkpoint)
    if logged and logged[-1] not in committed:
        return logged[-1]
    return committed[-1] + 1 if committed else 0


def check_readable(checkpoint: Checkpoint, recover_hint: str, logs: Logs | None = None) -> None:
    """Fail with one clear line when the last offset or commit log entry is damaged (truncated, not JSON).

    Spark would stop on it with a JVM stack trace; this names the file and the way out. ``logs``: the logs as
    listed already (a run's start lists them once), else listed now.
    """
    folder = _at(checkpoint)
    logs = logs or read_logs(folder)
    logged, committed = logs.logged, logs.committed
    if logs.stray_checksums:  # Spark would fail its next write with "Multiple streaming queries are concurrently ..."
        entries = ", ".join(stray.replace("/.", "/").removesuffix(".crc") for stray in logs.stray_checksums)
        raise PipelineError(
            f"{folder}: {entries} deleted while Hadoop's checksum file(s) beside it stayed "
            f"({', '.join(logs.stray_checksums)}): delete those checksum files too, then start "
            "again (no other query is using this checkpoint)"
        )
    beyond = [batch for batch in committed if batch not in logged and (not logged or batch > logged[-1])]
    if beyond:
        raise PipelineError(
            f"{folder}: commits/{beyond[0]} has no offsets/{beyond[0]} (the offset log ends at "
            f"{logged[-1] if logged else 'nothing'}): the offset log lost entries; restore a backup "
            f"(`streamproof checkpoint restore`) or rebuild the checkpoint ({recover_hint})"
        )
    for log, batches in (("offsets", logged), ("commits", committed)):
        if not batches:
            continue
        path = folder / log / str(batches[-1])
        lines = path.read_text().splitlines()
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


def log_batch(checkpoint: Checkpoint, batch_id: int, end_offsets: dict[str, dict[str, int]]) -> None:
    """Plan batch ``batch_id`` with ``end_offsets`` (as the sinks recorded them) instead of letting Spark plan it
    anew: write ``offsets/<batch_id>`` as Spark would, after the committed batch before it. Spark then runs exactly
    that range. The entry keeps the one before it's session confs, and carries the watermark Spark would give the
    batch on a restart (the larger of the one before it's and the one its commit passes on), so a stateful
    pipeline judges late records as the batch's first run did; one offsets line per source of the entry before it
    (a pipeline with dedup or windows reads its topic twice, one line each).

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> rebuild(checkpoint, {0: {"orders": {"0": 10}}}, committed_through=0)
    >>> log_batch(checkpoint, 1, {"orders": {"0": 25}})
    >>> next_batch_to_run(checkpoint), batch_end_offsets(checkpoint, 1)
    (1, {'orders': {'0': 25}})
    """
    folder = _at(checkpoint)
    before = batch_id - 1
    if before not in committed_batches(folder) or batch_id in logged_batches(folder):
        raise PipelineError(f"{folder}: batch {batch_id} can be planned only right after batch {before} committed")
    _write_entry(folder, batch_id, end_offsets)


def _write_entry(folder: Location, batch_id: int, end_offsets: dict[str, dict[str, int]]) -> None:
    before = batch_id - 1
    header, metadata_line, *source_lines = (folder / "offsets" / str(before)).read_text().splitlines()
    if len(set(source_lines)) != 1:  # dedup and windows read the topic twice (two branches): one position, twice
        raise PipelineError(
            f"{folder}: offsets/{before} holds positions of different sources; batch {batch_id} "
            "cannot be planned from one source's offsets"
        )
    metadata = json.loads(metadata_line)
    committed = (folder / "commits" / str(before)).read_text().splitlines()
    passed_on = json.loads(committed[1]).get("nextBatchWatermarkMs", 0) if len(committed) > 1 else 0
    metadata["batchWatermarkMs"] = max(int(metadata.get("batchWatermarkMs", 0)), int(passed_on))
    metadata["batchTimestampMs"] = int(time.time() * 1000)
    compact = {"separators": (",", ":")}
    sources = "\n".join([json.dumps(end_offsets, **compact)] * len(source_lines))  # type: ignore[arg-type]
    entry = f"{header}\n{json.dumps(metadata, **compact)}\n{sources}"  # type: ignore[arg-type]
    (folder / "offsets" / str(batch_id)).replace_with_text(entry)


def offsets_entry(checkpoint: Checkpoint, end_offsets: dict[str, dict[str, int]], like: int) -> str:
    """The text of an offset log entry ending at ``end_offsets``, with the header, batch metadata (session confs)
    and number of source lines of logged batch ``like``: an entry the log lost, written back from the offsets a sink
    recorded for that batch (``checkpoint rewind`` after ``recover``, which logs the newest batches only).

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> rebuild(checkpoint, {5: {"orders": {"0": 50}}}, committed_through=5)
    >>> offsets_entry(checkpoint, {"orders": {"0": 40}}, like=5).splitlines()[-1]
    '{"orders":{"0":40}}'
    """
    header, metadata_line, *source_lines = (_at(checkpoint) / "offsets" / str(like)).read_text().splitlines()
    sources = "\n".join([json.dumps(end_offsets, separators=(",", ":"))] * len(source_lines))
    return f"{header}\n{metadata_line}\n{sources}"


def commit_batch(checkpoint: Checkpoint, batch_id: int) -> None:
    """Mark the logged batch ``batch_id`` done without running it (``commits/<batch_id>``), as Spark would after it
    ran; for a stateless pipeline's batch that every sink holds (:func:`streamproof.checkpoint.positions.held_beyond`),
    which running it again would only skip.

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> rebuild(checkpoint, {0: {"orders": {"0": 10}}}, committed_through=0)
    >>> log_batch(checkpoint, 1, {"orders": {"0": 25}}); commit_batch(checkpoint, 1)
    >>> next_batch_to_run(checkpoint)
    2
    """
    folder = _at(checkpoint)
    if batch_id not in logged_batches(folder) or batch_id in committed_batches(folder):
        raise PipelineError(f"{folder}: batch {batch_id} can be marked done only once it is logged, and once")
    (folder / "commits" / str(batch_id)).replace_with_text(DONE)


def commit_without_running(
    checkpoint: Checkpoint, end_offsets: dict[int, dict[str, dict[str, int]]], batches: list[int]
) -> list[int]:
    """Log each of ``batches`` with its ``end_offsets`` (:func:`log_batch`; one logged already keeps its entry if it
    ends there) and mark it done (:func:`commit_batch`), in order, without running it: a stateless pipeline's batches
    that every sink holds (:func:`streamproof.checkpoint.positions.held_beyond`), which running again would only
    skip. Stops at the first batch that is logged with other offsets (Spark's plan stands). Both logs
    are listed once, where each batch listed them six times (a LIST each on S3) through :func:`log_batch` and
    :func:`commit_batch`; the run lock keeps every other writer off the logs meanwhile. Returns the batches marked
    done.

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> rebuild(checkpoint, {0: {"orders": {"0": 10}}}, committed_through=0)
    >>> commit_without_running(checkpoint, {1: {"orders": {"0": 25}}, 2: {"orders": {"0": 40}}}, [1, 2])
    [1, 2]
    >>> next_batch_to_run(checkpoint), batch_end_offsets(checkpoint, 2)
    (3, {'orders': {'0': 40}})
    """
    folder = _at(checkpoint)
    logged, committed = set(logged_batches(folder)), set(committed_batches(folder))
    done = []
    for batch_id in batches:
        if batch_id - 1 not in committed or batch_id in committed:
            raise PipelineError(f"{folder}: batch {batch_id} can be marked done only right after batch {batch_id - 1}")
        if batch_id in logged and batch_end_offsets(folder, batch_id) != end_offsets[batch_id]:
            break  # Spark planned it already with another range: it runs as planned
        if batch_id not in logged:
            _write_entry(folder, batch_id, end_offsets[batch_id])
            logged.add(batch_id)
        (folder / "commits" / str(batch_id)).replace_with_text(DONE)
        committed.add(batch_id)
        done.append(batch_id)
    return done


def rebuild(
    checkpoint: Location,
    end_offsets: dict[int, dict[str, dict[str, int]]],
    committed_through: int,
    confs: dict[str, str] | None = None,
) -> None:
    """Write a fresh checkpoint whose offset log holds ``end_offsets`` (batch id -> offsets) and whose commit
    log says batches up to ``committed_through`` are done.

    The offsets keep the key order they were recorded in (Spark's): Spark numbers a Kafka batch's partitions
    in that order (per-partition sinks key their commits on what each task writes, not on that number:
    :func:`streamproof.sinks.shares.peek_source_key`).

    Spark resumes such a checkpoint at the first uncommitted batch, re-running a logged one with exactly its
    logged offsets (it needs the entry before the newest one too, as the newest batch's start): the batch
    ids continue where the sinks are, so every sink's (pipeline, batch id) key keeps skipping what it holds.
    Format: Spark's offset log ``v1`` / batch metadata / one offsets line per source, and commit log ``v1`` /
    watermark; ``metadata`` holds a new query id (Spark requires the file).
    """
    (checkpoint / "offsets").mkdir()
    (checkpoint / "commits").mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    for batch_id, offsets in sorted(end_offsets.items()):
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": confs or {}}
        (checkpoint / "offsets" / str(batch_id)).write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps(offsets)}")
        if batch_id <= committed_through:
            (checkpoint / "commits" / str(batch_id)).write_text(DONE)
