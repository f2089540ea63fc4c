"""Everything verification reads: the source (through the pipeline's transform), the checkpoint's offset log
(for late records), the quarantine table and each sink; then the checker decides (``streamproof verify``).

With dedup on, a valid record older than the watermark of its batch is *late*: Spark's dedup operator drops it.
Verification recomputes which records were late from the checkpoint's offset log (each batch's offset range and
the watermark its late records were judged by, :func:`late_flags`), so the pipeline's own classification is
checked, not trusted. Late records are expected in quarantine (reason ``late``), or, with
``dedup.late = "drop"``, nowhere: they are then counted as ``dropped_late``.

Example::

    >>> [report.ok for report in verify_pipeline(spark, load_pipeline("orders.toml"))]   # doctest: +SKIP
    [True]
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streamproof import sources
from streamproof.checkpoint.log import (
    batch_end_offsets,
    batch_watermark_ms,
    committed_batches,
    late_event_watermark_ms,
    logged_batches,
)
from streamproof.config import KafkaSource, PipelineSpec
from streamproof.generator import load_manifest
from streamproof.kafka_client import require_topic
from streamproof.reconcile.checker import compare, compare_rows, reconcile_windows
from streamproof.reconcile.counts import (
    DROPPED,
    LATE_FLAG,
    LATE_TERMS,
    MAYBE_LATE,
    VALID,
    Check,
    Counts,
    check_for,
    unverifiable_maybe_late,
    unverifiable_without,
)
from streamproof.reconcile.cut import has_rows, read_through, sink_position, split_read
from streamproof.reconcile.read_through import ReadThrough, Unread, how_cut, judged_cut, shown, with_unread
from streamproof.reconcile.report import RECOMPUTED, Report, unlogged_late_basis
from streamproof.sinks import open_sinks
from streamproof.storage.location import Location
from streamproof.transform.records import (
    COORDINATES,
    EXACT_SUM,
    LATE,
    REJECT_REASON,
    behind_watermark,
    valid_records,
    with_derived_columns,
)
from streamproof.your_code.transform import LookupVersions, YourCode, expected_rows, your_rows_schema


def read_source(spark: SparkSession, spec: PipelineSpec, columns: list[str]) -> DataFrame:
    """The topic through the same transform as the pipeline (read_committed, earliest to latest): one row
    per source record with its coordinates, ``_valid`` and ``columns``."""
    parsed = sources.parsed_records(sources.read_batch(spark, spec), spec)
    return parsed.select(*COORDINATES, *columns, F.col(REJECT_REASON).isNull().alias(VALID))


def late_flags(spark: SparkSession, spec: PipelineSpec, source: DataFrame, quarantine: DataFrame | None) -> DataFrame:
    """``source`` with a boolean ``_late``: the valid records the pipeline's stateful operators dropped as late, and a
    boolean ``_maybe_late``: the records the offset log can no longer judge.

    Recomputed from the checkpoint's offset log: a record belongs to the batch whose offset range holds it,
    and is late when, against the watermark that batch judged late records by (the previous batch's, Spark's
    rule; :func:`streamproof.checkpoint.late_event_watermark_ms`), its event time (dedup) or its window's end
    (windows without dedup) is at or before it (:func:`streamproof.transform.records.late_condition`). Records no logged
    batch has read yet are not late. When the log no longer starts at batch 0 (Spark keeps the last 100 batches;
    an at-most-once start wipes it), the batches after its first entry are recomputed all the same; the records of
    the batches before them (offsets below the first entry's end) are judged by that entry's own watermark, the
    latest any of them can have used (a watermark never moves back): a record newer than it was not late; an older
    one is ``_maybe_late``. With ``late = "quarantine"`` those are late when the quarantine table lists them so
    (:func:`streamproof.reconcile.report.unlogged_late_basis`); with ``late = "drop"`` nothing says, and
    :func:`verify_pipeline` asks each sink (:func:`maybe_late_resolved`).

    >>> late_flags(spark, spec, read_source(spark, spec, ["event_id", "event_time"]), None)  # doctest: +SKIP
    """
    transform = spec.transform
    assert transform.watermark is not None
    batches = logged_batches(spec.checkpoint_dir)
    first = batches[0] if batches else 0
    unlogged = batch_end_offsets(spec.checkpoint_dir, first) if first else {}  # what the batches before it read
    ranges: list[tuple[str, int, int, int, int]] = []
    previous = unlogged
    for batch_id in batches[1:] if first else batches:
        watermark_ms = late_event_watermark_ms(spec.checkpoint_dir, batch_id)
        ends = batch_end_offsets(spec.checkpoint_dir, batch_id)
        for topic, partitions in ends.items():
            for partition, end in partitions.items():
                start = previous.get(topic, {}).get(partition, 0)
                ranges.append((topic, int(partition), start, end, watermark_ms))
        previous = ends
    schema = "_b_topic STRING, _b_partition INT, _b_start LONG, _b_end LONG, _b_watermark LONG"
    batch_ranges = F.broadcast(spark.createDataFrame(ranges, schema))
    in_batch = (
        (F.col("_src_topic") == F.col("_b_topic"))
        & (F.col("_src_partition") == F.col("_b_partition"))
        & (F.col("_src_offset") >= F.col("_b_start"))
        & (F.col("_src_offset") < F.col("_b_end"))
    )
    late = F.col(VALID) & (F.col("_b_watermark") > 0) & behind_watermark(transform, F.col("_b_watermark"))
    joined = source.join(batch_ranges, in_batch, "left")
    flagged = joined.withColumn(LATE_FLAG, F.coalesce(late, F.lit(False))).drop(
        *(c for c in joined.columns if c.startswith("_b_"))
    )
    bound = batch_watermark_ms(spec.checkpoint_dir, first) if first else 0
    if not bound:  # the whole log is there, or no batch before it had a watermark: nothing to ask anyone
        return flagged.withColumn(MAYBE_LATE, F.lit(False))
    older = F.col(VALID) & _below(unlogged) & behind_watermark(transform, F.lit(bound))
    flagged = flagged.withColumn(MAYBE_LATE, F.coalesce(older, F.lit(False)))
    if transform.late == "drop":
        return flagged
    listed = (
        quarantine.where(F.col("reason") == LATE).select(*COORDINATES).distinct()
        if quarantine is not None and "reason" in quarantine.columns
        else source.select(*COORDINATES).limit(0)
    ).withColumn("_listed_late", F.lit(True))
    trusted = flagged.join(listed, list(COORDINATES), "left")
    late_or_listed = F.col(LATE_FLAG) | (F.col(MAYBE_LATE) & F.col("_listed_late").isNotNull())
    return trusted.withColumn(LATE_FLAG, late_or_listed).drop("_listed_late")


def _below(ends: dict[str, dict[str, int]]) -> Column:
    """Records at offsets below ``ends`` (``{topic: {partition: offset}}``): read by the batches up to that entry."""
    below = F.lit(False)
    for topic, partitions in ends.items():
        for partition, end in partitions.items():
            below = below | (
                (F.col("_src_topic") == topic)
                & (F.col("_src_partition") == int(partition))
                & (F.col("_src_offset") < end)
            )
    return below


def maybe_late_resolved(source: DataFrame, held: DataFrame | None, identity: list[str] | None) -> tuple[DataFrame, int]:
    """``source`` with each ``_maybe_late`` record (``late = "drop"``, a batch the offset log no longer holds) judged
    by one sink: a record whose ``identity`` (dedup key or coordinates) the sink holds was delivered, or a record of
    its key was, and stays valid; any other is counted as dropped, never as lost (it may have been dropped as late;
    the report says it is not checked). ``identity`` None: a sink whose rows do not name records (a key's latest
    state, totals, windows): every one is counted as dropped. Returns the source and how many were."""
    if identity is None or held is None:
        judged = source.withColumn("_unseen", F.col(MAYBE_LATE))
    else:
        present = held.select(*identity).distinct().withColumn("_held", F.lit(True))
        judged = source.join(present, identity, "left").withColumn(
            "_unseen", F.col(MAYBE_LATE) & F.col("_held").isNull()
        )
    unseen = judged.where("_unseen").count()
    judged = judged.withColumn(VALID, F.col(VALID) & ~F.col("_unseen")).withColumn(
        DROPPED, F.col(DROPPED) | F.col("_unseen")
    )
    return judged.drop("_unseen", "_held"), unseen


def quarantine_reasons(quarantine: DataFrame | None) -> dict[str, int]:
    """Quarantined rows per reason, as stored in the quarantine table."""
    if quarantine is None:
        return {}
    rows = quarantine.groupBy("reason").count().collect()
    return {row["reason"]: int(row["count"]) for row in sorted(rows, key=lambda r: r["reason"])}


def _read_delta(spark: SparkSession, path: Location) -> DataFrame | None:
    return spark.read.format("delta").load(str(path)) if DeltaTable.isDeltaTable(spark, str(path)) else None


# Adaptive execution re-plans each query's stages as they run, in Spark jobs of their own: worth it on big shuffles,
# overhead on the checker's many small queries. A verify of the demo's pipeline (12,000 events), warm, 8 calls each
# way alternated: 8 Spark jobs instead of 16, median 2.95 s instead of 3.16 (the same reports); with a nemesis
# running beside it, 4.28 s instead of 5.62 (4 calls each).
ADAPTIVE = "spark.sql.adaptive.enabled"


def verify_pipeline(spark: SparkSession, spec: PipelineSpec, manifest_dir: Path | None = None) -> list[Report]:
    """Read everything the pipeline touched and reconcile it, one report per sink (``streamproof verify``).

    >>> [report.ok for report in verify_pipeline(spark, load_pipeline("orders.toml"))]   # doctest: +SKIP
    [True]
    """
    adaptive = spark.conf.get(ADAPTIVE) or "true"
    spark.conf.set(ADAPTIVE, "false")
    try:
        return _verified(spark, spec, manifest_dir)
    finally:
        spark.conf.set(ADAPTIVE, adaptive)


def _verified(spark: SparkSession, spec: PipelineSpec, manifest_dir: Path | None) -> list[Report]:
    sinks = open_sinks(spec)
    code = YourCode.of(spec)
    if code is not None:
        return _verify_your_code(spark, spec, code, sinks, manifest_dir)
    transform = spec.transform
    dedup, aggregate = transform.dedup, transform.aggregate
    dedup_keys = dedup.key_columns if dedup else None
    checks = [check_for(sink.spec) for sink in sinks]
    columns = list(
        dict.fromkeys(
            [
                *(dedup_keys or []),
                *([transform.watermark[0]] if transform.watermark else []),
                *((*aggregate.by, *aggregate.sum) if aggregate else ()),
                *(column for check in checks for column in check.columns),
            ]
        )
    )
    cut = read_through(spec)  # before the source, so that the source holds at least what the checkpoint names
    source = read_source(spark, spec, columns)
    quarantine_table = _read_delta(spark, spec.quarantine_path)
    basis = dict.fromkeys(("expected", "quarantined", "upstream_duplicates", "superseded", "dropped_late"), RECOMPUTED)
    if transform.watermark is not None:
        # Which records were late decides what is expected, quarantined and dropped.
        flagged = late_flags(spark, spec, source, quarantine_table)
        source = flagged.withColumn(VALID, F.col(VALID) & ~F.col(LATE_FLAG)).withColumn(
            DROPPED, F.col(LATE_FLAG) & F.lit(transform.late == "drop")
        )
    source = source.cache()
    logged = logged_batches(spec.checkpoint_dir) if transform.watermark is not None else []
    first_logged = logged[0] if logged else 0
    maybe_late = source.where(F.col(MAYBE_LATE)).count() if first_logged else 0
    late_terms = LATE_TERMS[transform.late]
    quarantine = (
        quarantine_table.select(*COORDINATES) if quarantine_table is not None else source.select(*COORDINATES).limit(0)
    )
    lows = first_offsets_held(spec)
    gone = _gone(lows)
    if gone is not None:  # the quarantine's rows of records gone from the source are not compared either
        quarantine = quarantine.where(~gone)
    reasons = quarantine_reasons(quarantine_table)
    generated = _generated(manifest_dir, spec.source.topic) if spec.source.kind == "kafka" else None
    quarantine_rows = not cut.logged and has_rows(quarantine)  # an empty checkpoint: does anything hold rows?
    reports = []
    try:
        for sink, check in zip(sinks, checks, strict=True):
            held = sink.read(spark)
            unverifiable = unverifiable_without(lows, check, dedup is not None, aggregate is not None)
            unavailable = 0
            if gone is not None and held is not None and not unverifiable:
                unavailable = held.where(gone).count()
                held = held.where(~gone)
            judged, unseen = source, 0
            if maybe_late and transform.late == "drop":
                named = aggregate is None and check.kind == "records"  # rows that name their records
                identity = (list(dedup_keys) if dedup_keys else list(COORDINATES)) if named else None
                judged, unseen = maybe_late_resolved(source, held, identity)
                judged = judged.cache()
                if not named:
                    unverifiable = unverifiable or unverifiable_maybe_late(maybe_late, first_logged)
            sink_basis = (
                basis | dict.fromkeys(late_terms, unlogged_late_basis(first_logged, transform.late, maybe_late, unseen))
                if first_logged
                else dict(basis)
            )
            sink_cut, why = judged_cut(cut, not cut.logged and has_rows(held), quarantine_rows)
            unverifiable = unverifiable or why
            try:
                counts = _judged(spec, check, judged, held, quarantine, sink_cut)
            finally:
                if judged is not source:
                    judged.unpersist()
            counts.unavailable = unavailable
            unit = "windows" if aggregate is not None else check.unit
            reports.append(
                Report(
                    pipeline=spec.name,
                    guarantee=spec.guarantee,
                    sink=sink.name,
                    **asdict(counts),
                    unit=unit,
                    quarantine_reasons=reasons,
                    generated=generated,
                    basis=sink_basis,
                    unverifiable=unverifiable,
                    other_writers=sink.other_writers(),
                    **shown(sink_cut),
                )
            )
    finally:
        source.unpersist()
    return reports


def _judged(
    spec: PipelineSpec, check: Check, source: DataFrame, held: DataFrame | None, quarantine: DataFrame, cut: ReadThrough
) -> Counts:
    """One sink's counts over the records its rows and the quarantine account for (the rules of
    :mod:`streamproof.reconcile.read_through`), with the others as ``not_yet_read``. Totals and windows are tried at
    the committed bounds, the planned ones, then the source's end: the first under which the sink reconciles, else
    the committed."""
    transform = spec.transform
    aggregate = transform.aggregate
    dedup_keys = transform.dedup.key_columns if transform.dedup else None
    how = how_cut(check, dedup_keys is not None, aggregate is not None)
    # Each option: how split_read finds the records read; None: every record (the source's end).
    if how == "trial":  # at C, at P, then at the source's end (a sink ahead of its checkpoint, restored older)
        options: list[dict[str, Any] | None] = [*({"at": at} for at in cut.candidates()), None]
    elif how == "position":
        options = [{"at": sink_position(cut, held) if not cut.no_cut else None}]
    else:
        options = [{"held": held}]
    committed_ms = _closed_through_ms(spec) if aggregate is not None else 0  # the windows closed at C
    closed_through = [committed_ms, *([cut.planned_watermark_ms] if cut.ahead else []), committed_ms]
    first = None
    for option, closed in zip(options, closed_through, strict=False):
        read, unread = split_read(source, cut, quarantine, **option) if option is not None else (source, Unread())
        if read is not source:
            read = read.cache()
        try:
            if aggregate is not None:
                empty = read.sparkSession.createDataFrame([], _window_schema(read, aggregate))
                rows = held if held is not None else empty
                counts = with_unread(reconcile_windows(read, rows, quarantine, transform, closed), unread)
            else:
                counts = with_unread(compare(check, read, held, quarantine, dedup_keys), unread)
        finally:
            if read is not source:
                read.unpersist()
        if not (counts.lost or counts.duplicated or counts.unexpected):
            return counts
        first = first or counts
        if not unread.rows:  # nothing was set apart: every later option judges the same records
            break
    assert first is not None
    return first


def _verify_your_code(
    spark: SparkSession, spec: PipelineSpec, code: YourCode, sinks: list[Any], manifest_dir: Path | None
) -> list[Report]:
    """Verification of a pipeline with your own transform: the oracle (your code over the source's valid records,
    each batch with the lookup versions it read: :func:`streamproof.your_code.transform.expected_rows`) against each
    sink, as rows (:func:`streamproof.reconcile.checker.compare_rows`); the quarantine side as for any pipeline."""
    rows_schema = your_rows_schema(spark, spec, exactly_once=False)  # checks the code, and ships it to the workers
    cut = read_through(spec)  # before the source, so that the source holds at least what the checkpoint names
    parsed = sources.parsed_records(sources.read_batch(spark, spec), spec)
    source = parsed.select(*COORDINATES, F.col(REJECT_REASON).isNull().alias(VALID)).cache()
    valid = valid_records(parsed)
    if spec.transform.columns:
        valid = with_derived_columns(valid, spec.transform)
    record = LookupVersions.of(spec) if spec.lookups else None
    oracles: dict[Any, DataFrame] = {}  # the rows your code makes of the records read, per cut
    quarantine_table = _read_delta(spark, spec.quarantine_path)
    quarantine = (
        quarantine_table.select(*COORDINATES) if quarantine_table is not None else source.select(*COORDINATES).limit(0)
    )
    reasons = quarantine_reasons(quarantine_table)
    lows = first_offsets_held(spec)
    gone = ", ".join(f"{topic}:{partition} below offset {low:,}" for (topic, partition), low in sorted(lows.items()))
    unverifiable = (
        (
            f"the source no longer holds its first records ({gone}: retention deleted them), so what your "
            "code made of them cannot be recomputed"
        )
        if lows
        else ""
    )
    generated = _generated(manifest_dir, spec.source.topic) if spec.source.kind == "kafka" else None
    basis = dict.fromkeys(("expected", "quarantined", "upstream_duplicates", "superseded"), RECOMPUTED)
    quarantine_rows = not cut.logged and has_rows(quarantine)  # an empty checkpoint: does anything hold rows?
    reports = []
    try:
        for sink in sinks:
            sink.rows_schema = rows_schema
            check = check_for(sink.spec)
            held = sink.read(spark)
            sink_cut, why = judged_cut(cut, not cut.logged and has_rows(held), quarantine_rows)
            # Your code's rows keep their records' coordinates (lineage); totals name none: read through C.
            named = check.kind != "totals" and held is not None and set(COORDINATES) <= set(held.columns)
            at = sink_position(sink_cut, held) if named else dict(sink_cut.committed)
            read, unread = split_read(source, sink_cut, quarantine, at=at)
            key = None if read is source else tuple(sorted(at.items()))
            if key not in oracles:
                given = valid if key is None else valid.where(_below(_ends(at)))
                oracles[key] = expected_rows(code, given, record).cache()
            counts = with_unread(compare_rows(check, read, oracles[key], held, quarantine), unread)
            unit = {"records": "rows"}.get(check.kind, check.unit)
            reports.append(
                Report(
                    pipeline=spec.name,
                    guarantee=spec.guarantee,
                    sink=sink.name,
                    **asdict(counts),
                    unit=unit,
                    quarantine_reasons=reasons,
                    generated=generated,
                    basis=dict(basis),
                    unverifiable=unverifiable or why,
                    **shown(sink_cut),
                )
            )
    finally:
        for rows in oracles.values():
            rows.unpersist()
        source.unpersist()
    return reports


def _ends(at: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Positions per (topic, partition) as Spark logs end offsets: ``{topic: {partition: offset}}``."""
    ends: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in at.items():
        ends.setdefault(topic, {})[str(partition)] = offset
    return ends


def first_offsets_held(spec: PipelineSpec) -> dict[tuple[str, int], int]:
    """The partitions of a Kafka source whose first offset still held is above 0 (retention deleted records
    before it), with that offset: records below it are unavailable, not lost.

    >>> first_offsets_held(load_pipeline("orders.toml"))                                  # doctest: +SKIP
    {('orders', 0): 1200}
    """
    if not isinstance(spec.source, KafkaSource):
        return {}
    return {(spec.source.topic, p): low for p, (low, _) in require_topic(spec.source).items() if low > 0}


def _gone(lows: dict[tuple[str, int], int]) -> Column | None:
    """Rows whose coordinates are below their partition's first offset held (None: no partition lost any)."""
    gone = None
    for (topic, partition), low in lows.items():
        here = (F.col("_src_topic") == topic) & (F.col("_src_partition") == partition) & (F.col("_src_offset") < low)
        gone = here if gone is None else gone | here
    return gone


def _closed_through_ms(spec: PipelineSpec) -> int:
    """The watermark of the last committed batch: the windows ending at or before it have been written."""
    committed = committed_batches(spec.checkpoint_dir)
    return batch_watermark_ms(spec.checkpoint_dir, committed[-1]) if committed else 0


def _window_schema(source: DataFrame, aggregate: Any) -> str:
    """The schema of window rows, for a sink not written yet."""
    by = ", ".join(f"`{c}` {source.schema[c].dataType.simpleString()}" for c in aggregate.by)
    sums = ", ".join(f"sum_{c} {EXACT_SUM}" for c in aggregate.sum)
    parts = ["window_start TIMESTAMP, window_end TIMESTAMP", by, sums, "events LONG" if aggregate.count else ""]
    return ", ".join(part for part in parts if part)


def _generated(manifest_dir: Path | None, topic: str) -> dict[str, Any] | None:
    if manifest_dir is None:
        return None
    manifest = load_manifest(manifest_dir, topic)
    return {"records": manifest["records"], "malformed": manifest["malformed"]} if manifest else None
