"""The function Spark calls for every micro-batch (``foreachBatch``): the phases of a batch, in order.

1. at-most-once only: the batch's end offsets are marked done (progress file), before anything is written;
2. crash point ``before-sink-write``;
3. the parsed batch is cached, so Kafka is fetched and JSON parsed once for all the writes that follow, and
   counted (records, quarantined, the oldest record's time) in the job that fills the cache;
   with dedup or windows on, the batch holds every record and, beside them, what the stateful operators let
   through (:func:`streamproof.transform.records.stateful_stream`): the records dedup kept, or the closed windows;
   records older than the batch's late-event watermark are the ``late`` ones Spark's operators dropped;
4. invalid records (and late ones, unless ``dedup.late = "drop"``) go to the quarantine Delta table (keyed
   on the batch like the sinks);
5. the ``mid-sink-write`` watcher is armed, then every sink writes the valid records, each keyed on its
   own (fan-out: a sink that already holds a replayed batch skips it, the others write it);
6. crash point ``after-sink-commit``; then Spark writes ``commits/<batch>`` once this function returns
   (the ``after-checkpoint-commit`` watcher kills right after that file appears).

Example::

    >>> from streamproof.sinks import open_sinks
    >>> writer = BatchWriter(spec, open_sinks(spec))                          # doctest: +SKIP
    >>> parsed.writeStream.foreachBatch(writer).start()                      # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streamproof.checkpoint.folder import ProgressFile
from streamproof.checkpoint.log import batch_end_offsets, batch_start_offsets, late_event_watermark_ms
from streamproof.checkpoint.marks import QuarantineMark
from streamproof.checkpoint.start import quarantine_table
from streamproof.config import PipelineSpec, schema_field_names
from streamproof.errors import PipelineError, SinkReplaced, first_line, is_transient
from streamproof.faults import points as faults
from streamproof.faults.in_tasks import held_back
from streamproof.pipeline.events import Event, WriteMoments, WriteStarted
from streamproof.sinks.base import Batch, Sink, SinkWrite
from streamproof.transform.records import (
    ALL_RECORDS,
    BRANCH,
    LATE,
    OPERATOR_OUTPUT,
    RAW_VALUE,
    REJECT_REASON,
    SOURCE_COLUMNS,
    SOURCE_TIMESTAMP,
    check_derived_columns,
    late_condition,
    quarantine_columns,
    quarantined_records,
    valid_records,
    with_derived_columns,
    with_extra_columns,
)
from streamproof.your_code.transform import (
    LookupVersions,
    Offsets,
    YourCode,
    check_determinism,
    check_lineage,
    your_rows_schema,
)

# A batch's quarantined records up to this many are written as one file (one task reading every cached partition),
# not one per Kafka partition: a batch's few hundred quarantined records made as many small files as the topic has
# partitions, each opened, written and closed by its own task. 3 alternated pairs of fresh drains (the bench topic,
# about 500 of 500,000 records quarantined a batch): the warm batches' quarantine 0.24-0.38 s against 0.30-0.43 s.
QUARANTINE_ONE_FILE_ROWS = 100_000
# A batch's rejected records are gathered to the driver by the job that counts the batch up to so many bytes of values
# (and QUARANTINE_ONE_FILE_ROWS rows), each partition its share; above, the quarantine's own job reads them from the
# cache: a batch of large rejected records must not outgrow the driver's memory or Spark's limit on task results.
QUARANTINE_GATHERED_BYTES = 32 << 20


@dataclass
class BatchResult:
    """What one batch did: rows to the sinks (per sink), rows to quarantine, replays skipped."""

    batch_id: int
    rows_out: int
    quarantined: int
    replay_skipped: bool = False  # every sink already held this replayed batch: nothing was written
    sink_seconds: dict[str, float] = field(default_factory=dict)  # per sink, time of its write
    sink_rows: dict[str, int] = field(default_factory=dict)  # per sink, rows written (0 for a skipped replay)
    rows_in: int | None = None  # source records in the batch (Spark's count doubles with dedup's two branches)
    duplicates_dropped: int = 0  # valid records the dedup operator dropped as seen before
    late: int = 0  # valid records older than the watermark (quarantined or dropped, by dedup.late)
    # Seconds of the writer's phases, in order: read_parse, quarantine (when written), sink:<label> per sink
    # (streamproof.pipeline.phases).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    oldest_produced_ms: int | None = None  # the batch's oldest record's source timestamp (Kafka: produce time)


class BatchWriter:
    """The ``foreachBatch`` function of a pipeline: quarantine, then every sink, with the crash hooks.

    A sink write that fails because its server is briefly away (:func:`streamproof.errors.is_transient`) is
    retried until ``[retry] max_outage`` where the guarantee allows it
    (:meth:`streamproof.guarantees.Wiring.retries_a_failed_write`): a keyed write retries what the failed attempt
    did not write and nothing twice. Past the bound the batch fails with one line naming the sink.
    """

    def __init__(self, spec: PipelineSpec, sinks: list[Sink], publish: Callable[[Event], None] | None = None) -> None:
        self.spec = spec
        self.sinks = sinks
        self.publish = publish or (lambda _: None)
        self.wiring = spec.wiring
        self.progress = ProgressFile(spec.checkpoint_dir) if self.wiring.progress_before_write else None
        self.results: dict[int, BatchResult] = {}
        # Each keyed sink's head after its last write in this run (sinks.base.Sink.head), the quarantine's too.
        self.quarantine = quarantine_table(spec)
        self.quarantine_mark = QuarantineMark(spec.checkpoint_dir)
        self.heads: dict[str, int] = {}
        self.code = YourCode.of(spec)
        self.lookup_versions = LookupVersions.of(spec) if spec.lookups else None
        self.determinism_checked = not self.wiring.idempotent_sink  # exactly-once checks it on a run's first batch
        # The run lock's check (RunLock.check): a run that lost its lease stops before its next durable write.
        self.lease_check: Callable[[], None] = lambda: None

    def fence(self, holder: str) -> None:
        """Every sink, the record of lookup versions and the quarantine mark, claimed for the run holding the lease
        ``holder`` (:meth:`streamproof.sinks.base.Sink.fence`, :meth:`LookupVersions.fence`,
        :meth:`QuarantineMark.fence`), before the run's first write.

        >>> writer.fence(lock.holder_id)                                                     # doctest: +SKIP
        """
        for sink in self.sinks:
            sink.fence(holder)
        if self.lookup_versions is not None:
            self.lookup_versions.fence(holder)
        if self.wiring.idempotent_sink:  # the mark's writer (keyed batches)
            self.quarantine_mark.fence(holder)

    def create_quarantine_table(self, parsed: DataFrame) -> None:
        """The quarantine table, when missing, created empty before the query starts, with the columns of the
        quarantined records of the query's ``parsed`` stream (coordinates, reason, bytes: whatever the pipeline file
        says of the records), so that a batch's quarantine commits into it rather than creating it on a cold JVM
        (docs/performance.md). A sink's table is still created by its first batch: its columns and partitioning
        follow the pipeline file, which a user may correct after a first run that failed.

        >>> writer.create_quarantine_table(parsed_stream)                                   # doctest: +SKIP
        """
        self.lease_check()
        self.quarantine.create_table(parsed.sparkSession, quarantined_records(parsed).schema)

    def _your_code(self, records: DataFrame, batch_id: int, start_offsets: Offsets | None) -> DataFrame:
        """Your transform on the batch's valid records, lookups at the versions recorded for the batch (recorded
        before any write: a replay reads them again); on a run's first batch, checked to give the same rows twice."""
        assert self.code is not None
        spark = records.sparkSession
        versions = (
            self.lookup_versions.versions_for(spark, self.code, batch_id, start_offsets)
            if self.lookup_versions is not None
            else None
        )
        if not self.determinism_checked:
            self.determinism_checked = check_determinism(self.code, records, versions)
        rows = self.code.apply(records, versions)
        check_lineage(rows.columns, self.code.what)
        return rows.persist(StorageLevel.MEMORY_AND_DISK_DESER)

    def _refuse_if_went_backwards(self, batch_id: int) -> None:
        """Stop before a batch when a sink (or the quarantine table) holds less than after its last write: its
        storage lost commits while the pipeline ran. The checkpoint has committed them, so the next start refuses
        it too, and ``checkpoint rewind`` replays what it lost."""
        for sink in [*self.sinks, self.quarantine]:
            seen = self.heads.get(sink.location)
            now = self._head(sink) if seen is not None else None
            if seen is not None and now is not None and now < seen:
                raise PipelineError(
                    f"{sink.called} ({sink.location}) went backwards while the pipeline ran: its "
                    f"{sink.head_meaning} is {now}, it was {seen} after its last write (its storage lost commits); "
                    f"stopped before batch {batch_id}: replay what it lost with "
                    f"`streamproof checkpoint rewind {self.spec._source_name}`"
                )

    @staticmethod
    def _head(sink: Sink) -> int | None:
        """The sink's head, or None while its server does not answer: the write that follows retries through an
        outage (``[retry] max_outage``), and a check must not stop a run the retries would carry through."""
        try:
            return sink.head()
        except SinkReplaced:
            raise  # an answer, not a server away (a PostgreSQL sink's refused connection is a PipelineError too)
        except Exception as error:  # noqa: BLE001 - any failure to read it is "unknown", never "went backwards"
            print(
                f"[{sink.pipeline.name}] {sink.name}: head not readable ({first_line(error)}); checked next batch",
                file=sys.stderr,
            )
            return None

    def _note_head(self, sink: Sink) -> None:
        head = self._head(sink)
        if head is None:
            self.heads.pop(sink.location, None)
        else:
            self.heads[sink.location] = head

    def __call__(self, parsed: DataFrame, batch_id: int) -> None:
        faults.batch_starting(batch_id)
        self.lease_check()
        end_offsets = batch_end_offsets(self.spec.checkpoint_dir, batch_id)
        if self.progress is not None:
            self.progress.mark_done(end_offsets, batch_id)  # at-most-once: done before written
        faults.reached(faults.BEFORE_SINK_WRITE, batch_id)
        if self.wiring.idempotent_sink:
            self._refuse_if_went_backwards(batch_id)
        transform = self.spec.transform
        late = (
            F.lit(False)
            if transform.watermark is None
            else late_condition(transform, late_event_watermark_ms(self.spec.checkpoint_dir, batch_id))
        )
        # Only a record bound for quarantine needs its raw bytes: the cache holds them for those alone. Measured on a
        # 500,000-order batch: 146.6 MB cached with every record's bytes, 66.8 MB without; the same time warm.
        raw = F.when(F.col(REJECT_REASON).isNotNull() | late, F.col(RAW_VALUE))
        parsed = parsed.withColumn(RAW_VALUE, raw).persist(StorageLevel.MEMORY_AND_DISK_DESER)
        transformed: DataFrame | None = None
        try:
            if transform.watermark is None:
                records, kept = parsed, valid_records(parsed)
            else:
                aggregate = transform.aggregate
                fields = schema_field_names(transform.schema_)
                # The union gave the record rows the window columns too (null): drop them from the records.
                window_only = [c for c in aggregate.output_columns if c not in fields] if aggregate else []
                records = parsed.where(F.col(BRANCH) == ALL_RECORDS).drop(BRANCH, *window_only)
                kept = parsed.where(F.col(BRANCH) == OPERATOR_OUTPUT)
                kept = kept.select(*aggregate.output_columns) if aggregate else valid_records(kept.drop(BRANCH))
            kept = with_extra_columns(kept)  # schema_evolution = "add-columns"; a no-op otherwise
            if transform.columns:
                kept = with_derived_columns(kept, transform)
            started = time.monotonic()
            counts = self._count(parsed, late if transform.watermark is not None else None)
            start_offsets = batch_start_offsets(self.spec.checkpoint_dir, batch_id)
            if self.code is not None:  # your transform: applied once (cached), so every sink gets the same rows
                kept = transformed = self._your_code(kept, batch_id, start_offsets)
                counts["kept"] = kept.count()
            phases = {"read_parse": time.monotonic() - started}
            late_count = counts["late"]
            quarantine_late = transform.watermark is not None and transform.late == "quarantine"
            quarantined = counts["invalid"] + (late_count if quarantine_late else 0)
            batch = Batch(
                self.spec.name,
                batch_id,
                end_offsets,
                self.wiring.idempotent_sink,
                counts["kept"],
                start_offsets=start_offsets,
                quarantined=quarantined,
            )
            if batch.keyed:  # every sink's replay rule before anything is written: a refusal leaves no sink changed
                for sink in [*self.sinks, *([self.quarantine] if quarantined else [])]:
                    sink.replay_check(batch)
            if quarantined:
                if quarantine_late:
                    reason = F.when(late, F.lit(LATE)).otherwise(F.col(REJECT_REASON))
                    records = records.withColumn(REJECT_REASON, reason)
                started = time.monotonic()
                self.lease_check()
                gathered = counts.get("rejected_rows")  # by the job that counted the batch, else read from the cache
                rejected = quarantined_records(records) if gathered is None else quarantine_columns(gathered)
                if quarantined <= QUARANTINE_ONE_FILE_ROWS:
                    rejected = rejected.coalesce(1)
                self.quarantine.append(rejected, batch)
                if batch.keyed:  # what a start compares the quarantine table with (checkpoint.positions)
                    self.lease_check()  # a woken run that lost its lease would set the mark back to its batch
                    self.quarantine_mark.record(batch_id)
                    self._note_head(self.quarantine)
                phases["quarantine"] = time.monotonic() - started
            writes, seconds = {}, {}
            context = parsed.sparkSession.sparkContext
            for index, sink in enumerate(self.sinks):
                point = faults.mid_write_armed(batch_id, sink.name, first_sink=index == 0)
                in_tasks = sink.writes_in_python_tasks
                self.publish(WriteStarted(self.spec.name, batch_id, sink.name, context.applicationId))
                started = time.monotonic()
                armed = replace(batch, task_fault=point if in_tasks else None)
                rows = kept if in_tasks else held_back(kept, point, batch_id)
                self.lease_check()
                with faults.sink_write(
                    batch_id,
                    context,
                    sink.name,
                    first_sink=index == 0,
                    in_tasks=in_tasks,
                    files_in=sink.data_files_folder,
                ):
                    writes[sink.name] = self._write_retrying(sink, rows, armed)
                went = writes[sink.name]
                if went.moments is not None:  # your sink: the crash harness learns its moments
                    moments = WriteMoments(self.spec.name, batch_id, sink.name, list(went.moments), list(went.unseen))
                    self.publish(moments)
                if batch.keyed:
                    self._note_head(sink)
                seconds[sink.name] = time.monotonic() - started
        finally:
            if transformed is not None:
                transformed.unpersist()
            parsed.unpersist()
        self.lease_check()  # Spark writes the batch's commit next
        faults.reached(faults.AFTER_SINK_COMMIT, batch_id)
        faults.kill_when_batch_committed(batch_id, (self.spec.checkpoint_dir / "commits" / str(batch_id)).exists)
        self.results[batch_id] = BatchResult(
            batch_id,
            rows_out=max((write.rows_out for write in writes.values()), default=0),
            quarantined=quarantined,
            replay_skipped=all(write.replay_skipped for write in writes.values()),
            sink_seconds=seconds,
            sink_rows={name: write.rows_out for name, write in writes.items()},
            rows_in=counts["records"],
            duplicates_dropped=(
                counts["valid"] - late_count - counts["kept"]
                if transform.dedup is not None and transform.aggregate is None
                else 0
            ),
            late=late_count,
            phase_seconds={**phases, **{f"sink:{name}": spent for name, spent in seconds.items()}},
            oldest_produced_ms=counts["oldest_produced_ms"],
        )

    @staticmethod
    def _count(parsed: DataFrame, late: Column | None) -> dict[str, Any]:
        """Records, invalid, valid, late and kept (for the sinks), and the oldest record's source timestamp (epoch
        ms, for the time the batch waited in the source), in the job that fills the batch's cache: from the
        statistics Spark's cache keeps of every batch of rows (``dev.streamproof.cache.CachedCounts``), which also
        gathers the rejected records themselves (``rejected_rows``, up to :data:`QUARANTINE_ONE_FILE_ROWS` and
        :data:`QUARANTINE_GATHERED_BYTES`) so that the quarantine's write does not scan the cache for them; or, with a
        watermark (``late``) or dedup's and windows' two branches, in one grouped query over the cached batch. In 3
        alternated pairs of fresh drains
        (docs/performance.md, 2026-11-30), the counts from the statistics cut the first batch's read and parse from
        4.08-4.62 s to 3.36-3.68 s, and the gathering the first batch's quarantine from 0.75-0.83 s to 0.60-0.75 s."""
        has_time = SOURCE_TIMESTAMP in parsed.columns
        if late is None and BRANCH not in parsed.columns:
            jvm = parsed.sparkSession._jvm
            assert jvm is not None, "a classic (not Connect) session"
            rejected_columns = [*SOURCE_COLUMNS, REJECT_REASON, RAW_VALUE]
            cached = jvm.dev.streamproof.cache.CachedCounts.of(
                parsed._jdf,
                REJECT_REASON,
                SOURCE_TIMESTAMP if has_time else None,
                rejected_columns if set(rejected_columns) <= set(parsed.columns) else [],
                QUARANTINE_ONE_FILE_ROWS,
                QUARANTINE_GATHERED_BYTES,
            )
            if cached is not None:
                records, invalid, oldest_micros = cached.records(), cached.rejected(), cached.leastMicros()
                rejected_rows = cached.rejectedRows()
                return {
                    "records": records,
                    "invalid": invalid,
                    "valid": records - invalid,
                    "late": 0,
                    "kept": records - invalid,
                    "oldest_produced_ms": None if oldest_micros is None else oldest_micros // 1000,
                    "rejected_rows": None if rejected_rows is None else DataFrame(rejected_rows, parsed.sparkSession),
                }
        late = F.lit(False) if late is None else late
        branch = F.col(BRANCH) if BRANCH in parsed.columns else F.lit(ALL_RECORDS)
        invalid_record = F.col(REJECT_REASON).isNotNull()
        oldest_time = F.min(F.unix_millis(SOURCE_TIMESTAMP)) if has_time else F.lit(None).cast("bigint")
        rows = (
            parsed.groupBy(
                branch.alias("branch"),
                F.when(invalid_record, "invalid").when(late, "late").otherwise("valid").alias("outcome"),
            )
            .agg(F.count(F.lit(1)).alias("count"), oldest_time.alias("oldest"))
            .collect()
        )
        by_outcome = {"invalid": 0, "late": 0, "valid": 0}
        kept = 0
        oldest = [row["oldest"] for row in rows if row["oldest"] is not None]
        for row in rows:
            if row["branch"] == ALL_RECORDS:
                by_outcome[row["outcome"]] += row["count"]
            else:
                kept += row["count"]
        valid = by_outcome["valid"] + by_outcome["late"]
        return {
            "records": valid + by_outcome["invalid"],
            "invalid": by_outcome["invalid"],
            "valid": valid,
            "late": by_outcome["late"],
            "kept": kept if BRANCH in parsed.columns else valid,
            "oldest_produced_ms": min(oldest, default=None),
        }

    def _write_retrying(self, sink: Sink, rows: DataFrame, batch: Batch) -> SinkWrite:
        retry = self.spec.retry
        deadline = time.monotonic() + retry.max_outage_s
        while True:
            try:
                return sink.write(rows, batch)
            except Exception as error:
                # A write that failed after this run lost its lease (paused inside it, taken over, woken): the new
                # holder's commit of this batch is what refused it, and the lease is what to say, in one line.
                self.lease_check()
                if not is_transient(error):
                    raise
                if not self.wiring.retries_a_failed_write(partial_writes_visible=sink.partial_writes_visible):
                    raise PipelineError(
                        f"{sink.location} failed in batch {batch.batch_id} ({first_line(error)}); not retried: the "
                        f"part of the batch it committed would be written twice, which {self.spec.guarantee} never "
                        "does (the rest of the batch is lost, as it allows)"
                    ) from None
                if time.monotonic() + retry.backoff_s > deadline:
                    raise PipelineError(
                        f"{sink.location} unreachable for more than {retry.max_outage} ({first_line(error)}); the "
                        "checkpoint is intact: start the pipeline again once it is back"
                    ) from None
                print(
                    f"[{self.spec.name}] {sink.name} unreachable in batch {batch.batch_id} ({first_line(error)}); "
                    f"retrying in {retry.backoff}",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(retry.backoff_s)


def open_batch_path(
    spark: SparkSession,
    spec: PipelineSpec,
    sinks: list[Sink],
    publish: Callable[[Event], None] | None = None,
    *,
    exactly_once: bool,
) -> BatchWriter:
    """What a run, and its warm-up on scratch copies, assemble before their query starts: your derived columns and
    your transform checked (:func:`~streamproof.transform.records.check_derived_columns`,
    :func:`~streamproof.your_code.transform.your_rows_schema`: ``exactly_once`` refuses what a replay would write
    otherwise), the schema of your transform's rows given to every sink; every sink's standing table checked
    (:meth:`Sink.refuse_unfit`), then each sink prepared (its table created if missing, so: after every refusal of
    the start); the batch writer over them.

    >>> writer = open_batch_path(spark, spec, open_sinks(spec), exactly_once=True)     # doctest: +SKIP
    >>> [sink.name for sink in writer.sinks]                                            # doctest: +SKIP
    ['delta']
    """
    check_derived_columns(spark, spec.transform, exactly_once=exactly_once)
    rows_schema = your_rows_schema(spark, spec, exactly_once=exactly_once)  # None without your transform
    for sink in sinks:
        sink.rows_schema = rows_schema
        sink.refuse_unfit(spark)  # every sink's, before any is prepared: a refusal leaves no table made
    for sink in sinks:
        sink.prepare(spark)
    return BatchWriter(spec, sinks, publish)
