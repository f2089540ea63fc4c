"""Each sink's position against the checkpoint: a sink behind it is refused, and ``checkpoint rewind`` repairs it;
and every refusal of a run's start, in the order it makes them (:func:`refuse_unsafe_start`, then
:func:`refuse_with_spark` for what needed Spark).

Storage can go backwards: a Delta table whose trailing commits vanished (an object store, a restore from
backup), a PostgreSQL database restored from an older dump. The checkpoint still says those batches are done, so
Spark would never run them again and the records would be gone without a word. Every keyed sink records each
batch it holds (:meth:`streamproof.sinks.base.Sink.commits`); at every start of an exactly-once pipeline each
sink's last batch is compared with the checkpoint's last committed one (:func:`refuse_if_sink_behind`), before
anything is written.

The repair (:func:`rewind`) replays the missing batches with their original ids and offsets, one at a time, from
the checkpoint's own offset log: the sinks that lack a batch write it, the others skip it by its key. The
checkpoint is copied aside first, never lost.

Example::

    >>> refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))  # doctest: +SKIP
    PipelineError: sink delta (...) is behind the checkpoint: it holds batches up to 6, the checkpoint ...
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

from streamproof.checkpoint.copies import aside, held_by_command
from streamproof.checkpoint.folder import RunLock
from streamproof.checkpoint.log import DONE, batch_end_offsets, check_readable, offsets_entry
from streamproof.checkpoint.marks import QuarantineMark
from streamproof.checkpoint.recover import refuse_if_checkpoint_lost
from streamproof.checkpoint.start import SinksAtStart, StartingPoint, quarantine_table, read_sinks, starting_point
from streamproof.config import KafkaSource, PipelineSpec
from streamproof.errors import PipelineError
from streamproof.kafka_client import Watermarks
from streamproof.sinks import open_sinks
from streamproof.sinks.base import OFFSETS_KEPT, TOO_OLD_REPAIR, Offsets, Sink, SinkCommit, recording
from streamproof.sinks.delta import DeltaSink
from streamproof.sinks.delta_log import LogPastItsCommits, log_past_its_commits, set_aside_stranded
from streamproof.sources import require_available


@dataclass(frozen=True)
class Behind:
    """A sink whose last batch is older than the checkpoint's last committed one."""

    sink: Sink
    holds_through: int  # -1: no batch at all
    committed_through: int
    why: str | None = None  # what its records say made it so (Sink.why_behind), when they tell

    @property
    def missing(self) -> str:
        first, last = self.holds_through + 1, self.committed_through
        return f"batch {first}" if first == last else f"batches {first}-{last}"


def refuse_unsafe_start(spark: SparkSession | None, spec: PipelineSpec) -> SinksAtStart:
    """Every refusal of the start that can be decided before Spark starts (all of them on local storage; ``spark``
    is there already when the checkpoint is on distributed storage), on one reading of the checkpoint's logs and one
    of each sink readable so far; returns that reading.

    >>> held = refuse_unsafe_start(None, load_pipeline("examples/orders_to_delta.toml"))  # doctest: +SKIP
    >>> held.unread                                                                      # doctest: +SKIP
    False
    """
    start = starting_point(spec)
    if not start.wiring.progress_before_write:  # at-most-once wipes Spark's logs on every start
        check_readable(spec.checkpoint_dir, f"`streamproof checkpoint recover {spec._source_name}`", start.logs)
    watermarks = require_available(spec)
    refuse_if_source_behind(spec, start, watermarks)
    held = read_sinks(spark, open_sinks(spec), start)  # without a JVM: the sinks readable without it
    refuse_if_checkpoint_lost(spec, held)
    refuse_if_sink_behind(spec, held)
    return held


def refuse_with_spark(spark: SparkSession, spec: PipelineSpec, held: SinksAtStart) -> SinksAtStart:
    """The refusals that needed Spark: a sink, or the quarantine table, on HDFS or an object store, left unread by the
    checks made without it; returns the reading of every sink.

    >>> held = refuse_with_spark(spark, spec, refuse_unsafe_start(None, spec))          # doctest: +SKIP
    """
    if held.unread:  # judged again whole, the sinks read before as they were: each is read once a start
        held = read_sinks(spark, held.opened, held.start, earlier=held)
        refuse_if_checkpoint_lost(spec, held)
        refuse_if_sink_behind(spec, held)
    return held


def sinks_behind(spec: PipelineSpec, held: SinksAtStart) -> list[Behind]:
    """The keyed sinks that hold fewer batches than the checkpoint committed (those left unread, needing Spark to
    read their log, are not judged).

    >>> held = read_sinks(None, open_sinks(spec), starting_point(spec))
    ... # doctest: +SKIP
    >>> [(lag.sink.name, lag.missing) for lag in sinks_behind(spec, held)]             # doctest: +SKIP
    [('delta', 'batch 10')]
    """
    start = held.start
    committed = start.logs.committed
    if not committed or not start.wiring.idempotent_sink:
        return []
    behind = [
        Behind(table.sink, table.holds_through, committed[-1], table.why_behind)
        for table in held.sinks
        # Not asked: not read yet, or your own sink (its records say what it was handed, not what it holds).
        if table.last_commit is not None and table.holds_through < committed[-1]
    ]
    quarantine = held.quarantine
    if quarantine.last_commit is None:
        return behind
    # A batch without invalid records writes no quarantine commit: the table is behind only when it lacks a batch the
    # checkpoint's mark says it received.
    mark = QuarantineMark(spec.checkpoint_dir).read()
    holds = quarantine.holds_through  # a failed read of its log stops the start, whatever the mark says
    if mark is not None and holds < min(mark, committed[-1]):
        return [*behind, Behind(quarantine.sink, holds, committed[-1], quarantine.why_behind)]
    return behind


def _offsets_text(spec: PipelineSpec, batch_id: int) -> str:
    try:
        return json.dumps(batch_end_offsets(spec.checkpoint_dir, batch_id))
    except PipelineError:
        return "(no longer in the offset log)"


def refuse_if_sink_behind(spec: PipelineSpec, held: SinksAtStart) -> None:
    """Refuse to start while a sink is behind the checkpoint: one line naming the sink, the batches it misses with
    their source offsets, and the repair.

    >>> refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))  # doctest: +SKIP
    """
    _refuse_if_storage_lost(held)
    for lag in sinks_behind(spec, held):
        begins = "the start of the source" if lag.holds_through < 0 else _offsets_text(spec, lag.holds_through)
        holds = "no batch" if lag.holds_through < 0 else f"batches up to {lag.holds_through}"
        why = lag.why or "its storage lost commits, or was restored from an older backup"
        raise PipelineError(
            f"{lag.sink.called} ({lag.sink.location}) is behind the checkpoint: it holds {holds}, the checkpoint "
            f"committed up to batch {lag.committed_through}, so {lag.missing} (source offsets from {begins} to "
            f"{_offsets_text(spec, lag.committed_through)}) are missing from it ({why}); replay them with "
            f"`streamproof checkpoint rewind {spec._source_name}`"
        )
    for log in _stranded_logs(held):
        shown = ", ".join(log.past.stranded[:3]) + (
            f" and {len(log.past.stranded) - 3} more" if len(log.past.stranded) > 3 else ""
        )
        raise PipelineError(
            f"{log.sink.called} ({log.sink.location}) has files of versions past its last commit (version "
            f"{log.past.last_commit}) in its log: {shown} (its storage lost commits Delta had written a checkpoint "
            "or a checksum of, and Delta cannot read the table so); set them aside, and replay what it lost if "
            f"anything, with `streamproof checkpoint rewind {spec._source_name}`"
        )


def _refuse_if_storage_lost(held: SinksAtStart) -> None:
    """A sink whose storage lost what its commit records cannot show (:meth:`Sink.storage_lost`): no replay mends it."""
    if held.start.logs.committed and held.start.wiring.idempotent_sink:
        for table in held.sinks:
            lost = table.storage_lost.get() if table.storage_lost is not None else None
            if lost is not None:
                raise PipelineError(f"{table.sink.called} ({table.sink.location}) {lost}")


@dataclass(frozen=True)
class StrandedLog:
    """A Delta table of the pipeline whose log holds files past its last commit file (:func:`log_past_its_commits`)."""

    sink: Sink
    past: LogPastItsCommits


def _stranded_logs(held: SinksAtStart) -> list[StrandedLog]:
    return [
        StrandedLog(table.sink, past)
        for table in held.tables  # the Delta sinks', then the quarantine table's log
        if table.stranded is not None and (past := table.stranded.get()) is not None
    ]


@dataclass(frozen=True)
class HeldBeyond:
    """What the sinks hold beyond the checkpoint's last committed batch (:func:`held_beyond`).

    ``offsets``: each such batch with the end offsets a sink holding it recorded (one holding it completely first),
    in order; ``everywhere``: the first of them that every sink holds completely with those offsets, whose records
    for the quarantine table are there too (held by it, or none), the batch before the first one ending where the
    checkpoint's last committed batch ends, and the pipeline stateless, so that running them again would only skip
    them.
    """

    offsets: dict[int, Offsets]
    everywhere: tuple[int, ...] = ()


def held_beyond(spec: PipelineSpec, sinks: list[Sink], start: StartingPoint) -> HeldBeyond:
    """The batches after the checkpoint's last committed one that the sinks (or the quarantine table) hold, with the
    end offsets they recorded: what a run replays with those offsets, one batch at a time
    (:func:`streamproof.checkpoint.log.log_batch`), before Spark plans anything itself. Without that, a checkpoint
    behind its sinks (an older backup restored) has Spark plan those batches anew, and with more records in the
    source by then their ranges differ from the ones the sinks hold. The batches every sink holds, of a stateless
    pipeline, need not run at all (``everywhere``): each sink would skip them.

    Exactly-once pipelines on a Kafka source only (a file or Delta source's position is its own log in the
    checkpoint, which a restored backup lacks for those batches: there the replay rule refuses what differs).

    >>> held_beyond(spec, open_sinks(spec), starting_point(spec)).offsets           # doctest: +SKIP
    {2: {'orders': {'0': 5012, '1': 4988}}, 3: {'orders': {'0': 7490, '1': 7510}}}
    """
    committed = start.logs.committed
    if not committed or not isinstance(spec.source, KafkaSource) or not start.wiring.idempotent_sink:
        return HeldBeyond({})
    last = committed[-1]
    by_sink = [sink.held_from(last) for sink in recording(sinks)]
    quarantine = start.quarantine.held_from(last + 1)
    # A batch some sink holds completely takes its offsets; one held only in part (some PostgreSQL or Kafka shares
    # committed before a kill) takes those its shares recorded: either way it runs with the range it was written with.
    offsets = _recorded_offsets([*by_sink, quarantine], lambda batch_id: batch_id > last, held_in_part=True)
    # A batch no sink holds (the quarantine table skips those without invalid records, and a sink may have lost its
    # commit) ended where the batch after it started, where a sink recorded that start (found by `prove --nemesis`
    # on S3: a lost Delta commit, the quarantine holding the batch after it, and no repair that could go on).
    for holds in (*by_sink, quarantine):
        for batch_id, commit in holds.items():
            if batch_id - 1 > last and commit.start_offsets is not None:
                offsets.setdefault(batch_id - 1, commit.start_offsets)
    gaps = sorted(set(range(last + 1, max(offsets, default=last) + 1)) - set(offsets))
    unrecorded = [batch for batch in gaps if any(batch in held and held[batch].end_offsets is None for held in by_sink)]
    if unrecorded:
        raise PipelineError(
            f"the sinks of pipeline {spec.name!r} hold batch(es) {unrecorded} beyond the checkpoint's last committed "
            f"batch {last} without the source offsets they were written with (a Parquet folder keeps them for its "
            f"newest {OFFSETS_KEPT} batches only, as Spark's offset log does; or the batch was written before "
            f"streamproof recorded them), so they cannot be replayed as they were: {TOO_OLD_REPAIR}"
        )
    if gaps:
        raise PipelineError(
            f"the sinks of pipeline {spec.name!r} hold batches {sorted(offsets)} beyond the checkpoint's last "
            f"committed batch {last} but none holds batch(es) {gaps}, whose offsets are then unknown: restore the "
            "checkpoint backup the sinks were written with, or rebuild it from their records (move it aside, then "
            f"`streamproof checkpoint recover {spec._source_name}`)"
        )
    offsets = dict(sorted(offsets.items()))
    if spec.transform.watermark is not None:  # dedup or windows: their state must see every batch run
        return HeldBeyond(offsets)
    if any(sink.records_hand_outs or not sink.keeps_batch_records for sink in sinks):
        return HeldBeyond(offsets)  # your own sink is handed each batch again: what a replay writes is your code's
    ends_at = _offsets_or_none(spec, last)
    if any(last in held and held[last].end_offsets not in (None, ends_at) for held in by_sink):
        return HeldBeyond(offsets)  # another history: the replay rule refuses it when run
    everywhere = []
    for batch_id, end_offsets in offsets.items():
        held_everywhere = all(
            batch_id in held and held[batch_id].complete and held[batch_id].end_offsets == end_offsets
            for held in by_sink
        )
        # Nothing of it left for the quarantine table: it holds the batch, or the batch had no record for it.
        quarantine_done = batch_id in quarantine or any(
            batch_id in held and held[batch_id].quarantined == 0 for held in by_sink
        )
        if not (held_everywhere and quarantine_done):
            break
        everywhere.append(batch_id)
    return HeldBeyond(offsets, tuple(everywhere))


def _offsets_or_none(spec: PipelineSpec, batch_id: int) -> Offsets | None:
    try:
        return batch_end_offsets(spec.checkpoint_dir, batch_id)
    except PipelineError:
        return None


def refuse_if_source_behind(spec: PipelineSpec, start: StartingPoint, watermarks: Watermarks | None) -> None:
    """Refuse to start when the Kafka topic no longer holds what the checkpoint says comes next: it ends before
    what was read (deleted and recreated, or truncated), or retention deleted records before they were read.
    Spark would skip such a gap (or fail with a stack trace, by ``failOnDataLoss``); under exactly-once it is
    stopped here with the numbers, whatever that option says.

    ``watermarks``: what :func:`streamproof.sources.require_available` answered at this start (a topic's watermarks;
    None for a source that is no topic): the check judges on them and asks Kafka nothing itself.

    >>> refuse_if_source_behind(spec, starting_point(spec), require_available(spec))      # doctest: +SKIP
    """
    checkpoint = spec.checkpoint_dir
    if not isinstance(spec.source, KafkaSource) or not start.wiring.idempotent_sink:
        return
    committed, logged = start.logs.committed, start.logs.logged
    if not logged:
        return
    assert watermarks is not None, "require_available answers a topic with its watermarks"
    topic = spec.source.topic
    read = _topic_offsets(spec, committed[-1]) if committed else {}  # read and committed: must not be past the end
    to_read = _topic_offsets(spec, logged[-1])  # an in-flight batch is replayed from ``read`` to here
    ends_early = []
    for partition, end in sorted(to_read.items()):
        now = f"ends at offset {watermarks[partition][1]}" if partition in watermarks else "is gone"
        if partition not in watermarks or watermarks[partition][1] < end:
            ends_early.append(f"partition {partition} {now}, the checkpoint has read up to {end}")
    if ends_early:
        raise PipelineError(
            f"topic {topic} is behind the checkpoint {checkpoint}: {'; '.join(ends_early)} (the topic was deleted "
            "and recreated, or truncated); the sinks hold records that are no longer in it: start this pipeline "
            "afresh on a new checkpoint and new sinks, or restore the topic"
        )
    # Only past a committed batch: the first batch starts wherever the source started then.
    deleted = [
        f"partition {p}: offsets {read[p]}-{earliest - 1} ({earliest - read[p]:,} records)"
        for p, (earliest, _) in sorted(watermarks.items())
        if p in read and earliest > read[p]
    ]
    if deleted:
        raise PipelineError(
            f"topic {topic} deleted records before this pipeline read them (retention): {'; '.join(deleted)}; "
            "exactly-once cannot continue past a gap in the source: raise the topic's retention and restore the "
            "records, or accept the loss by starting on a new checkpoint (`verify` reports them as unavailable)"
        )


def _topic_offsets(spec: PipelineSpec, batch_id: int) -> dict[int, int]:
    assert isinstance(spec.source, KafkaSource)
    try:
        ends = batch_end_offsets(spec.checkpoint_dir, batch_id)
    except PipelineError:
        return {}
    return {int(p): offset for p, offset in ends.get(spec.source.topic, {}).items()}


def rewind(spec: PipelineSpec, replay: Callable[[PipelineSpec], None], spark: SparkSession | None = None) -> str:
    """Set the checkpoint back to the position of the sink furthest behind and replay every batch after it, each
    with its original id and offsets (``replay`` runs the pipeline for the one batch logged and not committed).
    Refused while the source no longer holds the first offsets to replay. Returns what was done, in one line.

    >>> print(rewind(spec, lambda spec: run(spec, once=True)))    # doctest: +SKIP
    replayed batches 8-10 with their original offsets into delta (from batch 10), pg (from batch 8); ...
    """
    if not spec.wiring.idempotent_sink:
        raise PipelineError(
            "checkpoint rewind replays batches into sinks that skip what they hold: exactly-once pipelines only"
        )
    with held_by_command(spec.checkpoint_dir, "rewind", "checkpoint rewind") as lock:  # its replays run inside it
        return _rewind_held(spec, replay, spark, lock)


def _rewind_held(
    spec: PipelineSpec, replay: Callable[[PipelineSpec], None], spark: SparkSession | None, lock: RunLock
) -> str:
    """:func:`rewind` under the run lock (each replay's run joins it and checks it before each write, as a run does;
    the command checks it before it changes the checkpoint)."""
    checkpoint = spec.checkpoint_dir
    sinks = open_sinks(spec)
    start = starting_point(spec)
    held = read_sinks(spark, sinks, start)
    lags = sinks_behind(spec, held)
    if not lags:
        put_aside = _set_aside(_logs_to_set_aside(held, lags))
        if put_aside:
            return (
                f"every sink holds every batch {checkpoint} committed; set aside {len(put_aside)} file(s) of lost "
                f"Delta versions ({', '.join(put_aside)}): the next run replays what the checkpoint has not "
                "committed"
            )
        return f"every sink holds every batch {checkpoint} committed: nothing to rewind"
    low = min(lag.holds_through for lag in lags)
    logged = set(start.logs.logged)  # listed by starting_point above; nothing wrote the log since
    # Through the last batch logged, not only the last committed: a run stopped mid-batch (a sink found going
    # backwards) leaves the next batch planned; left in the log, Spark would run it and never replay the others.
    last = max(lags[0].committed_through, *logged)
    gone = [batch for batch in range(max(low, 0), last + 1) if batch not in logged]
    recorded = _recorded_by_the_sinks(spec, sinks, gone) if logged else {}
    unknown = [batch for batch in gone if batch not in recorded]
    if unknown:
        raise PipelineError(
            f"the offset log no longer holds batch(es) {unknown} (Spark keeps the last 100) and no sink recorded "
            "them: their original offsets are unknown, so they cannot be replayed as they were; restore the sinks "
            "or a checkpoint backup"
        )
    like = min(logged) if logged else 0
    entries = {
        batch: offsets_entry(checkpoint, recorded[batch], like=like)
        if batch in recorded
        else (checkpoint / "offsets" / str(batch)).read_text()
        for batch in range(low + 1, last + 1)
    }
    # The refusals the replays' runs would meet at their start, judged now, before anything is changed.
    watermarks = require_available(spec)  # the source is there; a topic's watermarks
    if isinstance(spec.source, KafkaSource):
        assert watermarks is not None, "require_available answers a topic with its watermarks"
        # Where the first batch replayed starts: the end of the batch before, from the log, or from a sink's record
        # of it where the log lost it (written back below, after every refusal: a refused rewind changes nothing).
        first = recorded[low] if low in recorded else batch_end_offsets(checkpoint, low) if low >= 0 else {}
        _refuse_if_source_lost(spec.source, first, watermarks)
        refuse_if_source_behind(spec, start, watermarks)
    _refuse_if_storage_lost(held)
    stranded_logs = _logs_to_set_aside(held, lags)  # refuses a table no replay can mend
    strays = [name for lag in lags for name in remove_stray_checksums(lag.sink)]
    lock.check()  # a command paused past its lease and taken over changes nothing
    kept = aside(checkpoint, "before-rewind")
    checkpoint.copy_tree(kept, skip=(RunLock.NAME,))
    if low in recorded:  # Spark reads the start of the first batch replayed from the entry before
        (checkpoint / "offsets" / str(low)).write_text(offsets_entry(checkpoint, recorded[low], like=like))
        (checkpoint / "commits" / str(low)).write_text(DONE)
    # Removed strays may be among the files listed: then the logs are looked at again. The removal takes checksums
    # only, never a commit file a log needs, so that look refuses nothing the first let pass.
    if strays:
        stranded_logs = _logs_to_set_aside(held, lags)
    stranded = _set_aside(stranded_logs)
    for batch in range(low + 1, last + 1):
        for log in ("commits", "offsets"):
            for name in (str(batch), f".{batch}.crc"):
                if (checkpoint / log / name).exists():
                    (checkpoint / log / name).delete()
    for batch, text in entries.items():
        (checkpoint / "offsets" / str(batch)).write_text(text)
        replay(spec)
        if not (checkpoint / "commits" / str(batch)).exists():
            raise PipelineError(
                f"the replay of batch {batch} did not commit; the checkpoint before the rewind is kept as {kept}"
            )
    behind = ", ".join(f"{lag.sink.name} (from batch {lag.holds_through + 1})" for lag in lags)
    removed = (
        f"; removed {len(strays)} stray checksum file(s) of lost log entries ({', '.join(strays)})" if (strays) else ""
    )
    moved = f"; set aside {len(stranded)} file(s) of lost Delta versions ({', '.join(stranded)})" if stranded else ""
    return (
        f"replayed batches {low + 1}-{last} with their original offsets into {behind}; the other sinks skipped "
        f"them by their keys; the checkpoint before the rewind is kept as {kept}{removed}{moved}"
    )


def _recorded_by_the_sinks(spec: PipelineSpec, sinks: list[Sink], batches: list[int]) -> dict[int, Offsets]:
    """The end offsets the sinks (or the quarantine table) recorded for ``batches``, each held whole: the
    original range of a batch the offset log no longer holds, as after ``checkpoint recover`` (it logs the newest
    batches only). A stateless pipeline on Kafka only: a stateful one's state of those batches is gone with them."""
    if not batches or spec.transform.watermark is not None or not isinstance(spec.source, KafkaSource):
        return {}
    held = [sink.held_from(min(batches)) for sink in [*recording(sinks), quarantine_table(spec)]]
    # A record of part of a batch (some PostgreSQL or Kafka shares) is not its range: only whole ones.
    return _recorded_offsets(held, lambda batch_id: batch_id in batches, held_in_part=False)


def _recorded_offsets(
    held: list[dict[int, SinkCommit]], wanted: Callable[[int], bool], *, held_in_part: bool
) -> dict[int, Offsets]:
    """The end offsets the sinks recorded for the ``wanted`` batches among ``held`` (one dict per sink), a record of
    a batch held whole first; with ``held_in_part``, a batch no sink holds whole takes the offsets its shares
    recorded."""
    recorded: dict[int, Offsets] = {}
    for complete in (True, False) if held_in_part else (True,):
        for holds in held:
            for batch_id, commit in holds.items():
                if wanted(batch_id) and commit.end_offsets is not None and commit.complete == complete:
                    recorded.setdefault(batch_id, commit.end_offsets)
    return recorded


def _logs_to_set_aside(held: SinksAtStart, lags: list[Behind]) -> list[StrandedLog]:
    """The Delta logs holding files of lost versions past their last commit, which a rewind sets aside, each looked at
    whole: those of the tables behind the checkpoint, and of the others those the start found such files in (a lost
    version of a batch the checkpoint had not committed), which the replays' runs would otherwise refuse. A table
    whose log also lost commit files only such a file stood for (after log clean-up) is refused: no replay mends it,
    only a restore."""
    behind = {id(lag.sink) for lag in lags}
    tables = [lag.sink for lag in lags] + [log.sink for log in _stranded_logs(held) if id(log.sink) not in behind]
    logs = [
        StrandedLog(table, past)
        for table in tables
        if isinstance(table, DeltaSink) and (past := log_past_its_commits(table.path, thorough=True)) is not None
    ]
    for log in logs:
        if log.past.needs:
            needs = log.past.needs
            shown = ", ".join(needs[:3]) + (f" and {len(needs) - 3} more" if len(needs) > 3 else "")
            raise PipelineError(
                f"{log.sink.called} ({log.sink.location}) cannot be read back to its last commit (version "
                f"{log.past.last_commit}): its log also lost {shown} in {log.past.table / '_delta_log'}, which only "
                "the checkpoint of a lost version stood for; restore those files (or the table) from a backup, then "
                "rewind"
            )
    return logs


def _set_aside(logs: list[StrandedLog]) -> list[str]:
    """Set each log's files of lost versions aside into its table's ``_streamproof_set_aside/rewind-<time>/``: a
    lost version's checkpoint (and the pointer to it) left in the log makes every read and write of the table fail;
    set aside, the table reads again at its last commit. Returns where the files went."""
    when = time.strftime("%Y%m%dT%H%M%S")
    return [
        path
        for log in logs
        for path in set_aside_stranded(log.past, log.past.table / "_streamproof_set_aside" / f"rewind-{when}")
    ]


def remove_stray_checksums(sink: Sink) -> list[str]:
    """Remove the hidden checksum files (Hadoop's ``.N.json.crc``) of log entries that are gone from a sink's own
    log: left behind, they make the entry's rewrite fail with a checksum error. Returns their paths.

    >>> remove_stray_checksums(open_sinks(spec)[0])             # doctest: +SKIP
    ['/data/orders/_delta_log/.00000000000000000011.json.crc']
    """
    folder = sink.data_files_folder
    if folder is None:
        return []
    removed = []
    for log in (folder / "_delta_log", folder / "_spark_metadata"):
        names = {path.name for path in log.iterdir()} if log.is_dir() else set()
        for name in sorted(names):
            if name.startswith(".") and name.endswith(".crc") and name[1:-4] not in names:
                (log / name).unlink()
                removed.append(str(log / name))
    return removed


def _refuse_if_source_lost(source: KafkaSource, start: Offsets, watermarks: Watermarks) -> None:
    """The first offsets to replay (``start``: where the batch before ends) must still be in the topic (retention
    may have deleted them); ``watermarks``: the topic's, read for the rewind."""
    first = {int(p): offset for p, offset in start.get(source.topic, {}).items()}
    lost = {p: (first.get(p, 0), earliest) for p, (earliest, _) in watermarks.items() if earliest > first.get(p, 0)}
    if lost:
        described = ", ".join(
            f"partition {p} from offset {want} (now starts at {have})" for p, (want, have) in sorted(lost.items())
        )
        raise PipelineError(
            f"topic {source.topic} no longer holds the records to replay: {described}; they are gone from the "
            "source (retention, or the topic was recreated): restore the sinks from a backup instead"
        )
