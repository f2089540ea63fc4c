"""Reconciliation of a source against a sink: lost, duplicated, quarantined, unexpected.

The checker (:func:`reconcile`) is a pure function of three datasets, Jepsen-style: the source records
(coordinates + whether each is valid), the sink rows and the quarantine rows. Reading Kafka and Delta
happens before it (:func:`read_datasets`), so the same checker serves ``verify``, ``prove``, the tests
and the benchmarks. The datasets are Spark DataFrames so that a 100M-record topic reconciles the same
way as a hand-made one; every figure is an exact count from the data.

Rules (DESIGN.md): every valid source record must be in the sink exactly once and every invalid one
in quarantine exactly once, matched on source coordinates (topic, partition, offset), or on the
dedup key columns when the pipeline deduplicates (then ``expected`` = distinct valid keys and the
extra valid records are ``upstream_duplicates``).

* ``lost``: expected records (or keys) missing from the sink, plus invalid records missing from quarantine;
* ``duplicated``: extra rows for one record (or key), in the sink or in quarantine;
* ``unexpected``: rows no source record explains (unknown coordinates, a valid record in quarantine,
  an invalid record in the sink);
* ``source_records = expected + quarantined + upstream_duplicates + superseded + dropped_late`` holds whenever
  ``ok``.

With dedup on, a valid record older than the watermark of its batch is *late*: Spark's dedup operator drops it.
Verification recomputes which records were late from the checkpoint's offset log (each batch's offset range and
the watermark its late records were judged by, :func:`late_flags`), so the pipeline's own classification is
checked, not trusted. Late records are expected in quarantine (reason ``late``), or, with
``dedup.late = "drop"``, nowhere: they are then counted as ``dropped_late``.

Sinks that hold a *state* rather than one row per record are compared with the state the source implies
(:class:`streamproof.sinks.base.Check`), and count in keys or groups (``unit`` in the report):

* ``latest`` (Delta merge, PostgreSQL upsert): one row per key holding the key's latest valid record;
  a key whose row is an older record of it counts as ``lost`` (its latest update is missing); the other
  valid records of a key are ``superseded``;
* ``totals`` (PostgreSQL accumulate): one row per group with the sums and the record count ``events``;
  a group counted more times than the source has records is ``duplicated`` (an increment applied
  twice), fewer is ``lost``, equal counts with different sums is ``duplicated`` (a value mismatch).

Example::

    >>> report = reconcile(source, sink, quarantine)                 # doctest: +SKIP
    >>> report.lost, report.duplicated, report.ok                    # doctest: +SKIP
    (0, 0, True)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamproof import sources
from streamproof.config import PipelineSpec
from streamproof.sinks.base import Check
from streamproof.transform import COORDINATES, EXACT_SUM, REJECT_REASON, behind_watermark, parse_records, window_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VALID = "_valid"
DROPPED = "_dropped"  # a record that by configuration goes nowhere (a late record with dedup.late = "drop")
LATE_FLAG = "_late"


@dataclass
class Report:
    """The reconciliation report; ``to_json`` gives DESIGN.md's format."""

    pipeline: str
    guarantee: str
    sink: str
    source_records: int
    expected: int
    quarantined: int
    upstream_duplicates: int
    sink_records: int
    lost: int
    duplicated: int
    unexpected: int
    superseded: int = 0
    dropped_late: int = 0
    aggregated: int = 0  # windows: records folded into the closed windows
    pending: int = 0  # windows: valid records in windows the watermark has not closed yet (not written yet)
    unit: str = "records"  # what expected/lost/duplicated count: records, keys (latest) or groups (totals)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    generated: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    @property
    def guarantee_held(self) -> bool:
        """Whether the damage found is within what the guarantee promises.

        exactly-once allows none; at-least-once allows duplicates, never loss; at-most-once allows loss,
        never duplicates. Unexpected rows are never allowed.
        """
        if self.unexpected:
            return False
        if self.guarantee == "at-least-once":
            return self.lost == 0
        if self.guarantee == "at-most-once":
            return self.duplicated == 0
        return self.ok

    @property
    def identity_holds(self) -> bool:
        delivered = self.aggregated + self.pending if self.unit == "windows" else self.expected + self.superseded
        return self.source_records == delivered + self.quarantined + self.upstream_duplicates + self.dropped_late

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.generated is None:
            data.pop("generated")
        data["ok"] = self.ok
        data["guarantee_held"] = self.guarantee_held
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass(frozen=True)
class Counts:
    source_records: int
    expected: int
    quarantined: int
    upstream_duplicates: int
    sink_records: int
    lost: int
    duplicated: int
    unexpected: int
    superseded: int = 0
    dropped_late: int = 0
    aggregated: int = 0
    pending: int = 0


def reconcile(
    source: DataFrame, sink: DataFrame, quarantine: DataFrame, key_columns: list[str] | None = None
) -> Counts:
    """Exact counts from three datasets, one sink row expected per valid record.

    ``source``: one row per source record with the coordinate columns and a boolean ``_valid``
    (plus ``key_columns`` when deduplicating). ``sink``: the coordinate columns (or ``key_columns``).
    ``quarantine``: the coordinate columns. A source row may carry ``_dropped`` (true: expected nowhere).
    """
    side = _quarantine_side(source, quarantine)
    sink_side = _identity_side(source, sink, key_columns)
    return _counts(side, sink_side, upstream_duplicates=side["valid_records"] - sink_side["expected"])


def reconcile_latest(source: DataFrame, sink: DataFrame, quarantine: DataFrame, key: str, order_by: str) -> Counts:
    """Exact counts for a sink holding the latest valid record of each ``key`` (merge, upsert).

    ``source`` needs the coordinates, ``_valid``, ``key`` and ``order_by``; ``sink`` the coordinates and ``key``.
    The latest record of a key is the greatest by ``order_by`` (null oldest), then topic, partition, offset:
    the same order the sinks apply.

    >>> reconcile_latest(source, sink, quarantine, "order_id", "event_time").lost    # doctest: +SKIP
    0
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    coords = list(COORDINATES)
    valid = source.where(F.col(VALID)).select(key, *coords, order_by)
    newest_first = Window.partitionBy(key).orderBy(F.col(order_by).desc_nulls_last(), *(F.desc(c) for c in coords))
    winners = (
        valid.withColumn("_rank", F.row_number().over(newest_first)).where("_rank = 1")
        .select(key, *(F.col(c).alias(f"_w{c}") for c in coords))
    )  # fmt: skip
    known = valid.select(key, *coords).withColumn("_known", F.lit(True))
    rows = sink.select(key, *coords).join(known, [key, *coords], "left").join(winners, key, "left")
    is_winner = F.lit(True)
    for column in coords:
        is_winner = is_winner & F.coalesce(F.col(column) == F.col(f"_w{column}"), F.lit(False))
    per_key = rows.groupBy(key).agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("_known").isNotNull().cast("int")).alias("known"),
        F.max(is_winner.cast("int")).alias("has_winner"),
    )
    row = (
        winners.select(key, F.lit(True).alias("_expected"))
        .join(per_key, key, "full_outer")
        .agg(
            F.sum(F.col("_expected").isNotNull().cast("int")).alias("expected"),
            F.sum(F.when(F.col("_expected").isNotNull() & (F.coalesce("has_winner", F.lit(0)) == 0), 1).otherwise(0))
            .alias("lost"),
            F.sum(F.when(F.col("known") > 1, F.col("known") - 1).otherwise(0)).alias("dup"),
            F.sum(F.coalesce(F.col("n") - F.col("known"), F.lit(0))).alias("unexpected"),
            F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
        )
        .first()
    )  # fmt: skip
    side, sink_side = _quarantine_side(source, quarantine), _sink_side(row)
    return _counts(side, sink_side, superseded=side["valid_records"] - sink_side["expected"])


def reconcile_totals(source: DataFrame, sink: DataFrame, quarantine: DataFrame, by: str, sums: list[str]) -> Counts:
    """Exact counts for a sink holding per-``by`` totals of ``sums`` and a record count ``events``.

    Sums are compared as ``DECIMAL(38, 10)`` on both sides, so no float rounding hides or invents a difference.

    >>> reconcile_totals(source, sink, quarantine, "customer_id", ["amount"]).duplicated    # doctest: +SKIP
    0
    """
    from pyspark.sql import functions as F

    exact = "DECIMAL(38, 10)"
    expected_totals = (
        source.where(F.col(VALID)).groupBy(by)
        .agg(F.count(F.lit(1)).alias("_x_events"),
             *(F.sum(F.coalesce(F.col(c).cast(exact), F.lit(0).cast(exact))).alias(f"_x_{c}") for c in sums))
    )  # fmt: skip
    held = sink.select(by, F.col("events").alias("_s_events"), *(F.col(c).cast(exact).alias(f"_s_{c}") for c in sums))
    per_group = held.groupBy(by).agg(
        F.count(F.lit(1)).alias("n"), F.sum("_s_events").alias("_s_events"),
        *(F.sum(f"_s_{c}").alias(f"_s_{c}") for c in sums),
    )  # fmt: skip
    same_sums = F.lit(True)
    for column in sums:
        same_sums = same_sums & (F.col(f"_s_{column}") == F.col(f"_x_{column}"))
    both = F.col("_x_events").isNotNull() & F.col("n").isNotNull()
    row = (
        expected_totals.join(per_group, by, "full_outer")
        .agg(
            F.sum(F.col("_x_events").isNotNull().cast("int")).alias("expected"),
            F.sum(F.when(F.col("_x_events").isNotNull() & F.col("n").isNull(), 1)
                  .when(both & (F.col("_s_events") < F.col("_x_events")), 1).otherwise(0)).alias("lost"),
            F.sum(F.when(both & (F.col("_s_events") > F.col("_x_events")), 1)
                  .when(both & (F.col("_s_events") == F.col("_x_events")) & ~same_sums, 1).otherwise(0)).alias("dup"),
            F.sum(F.when(F.col("_x_events").isNull(), F.col("n")).otherwise(0)).alias("unexpected"),
            F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
        )
        .first()
    )  # fmt: skip
    side, sink_side = _quarantine_side(source, quarantine), _sink_side(row)
    return _counts(side, sink_side, superseded=side["valid_records"] - sink_side["expected"])


def reconcile_windows(
    source: DataFrame, sink: DataFrame, quarantine: DataFrame, transform: Any, closed_through_ms: int
) -> Counts:
    """Exact counts for a sink of window rows (``[transform] aggregate``), every value compared.

    The windows are recomputed from the valid, not-late source records (one per dedup key when dedup is on)
    with the pipeline's own :func:`streamproof.transform.window_rows`. A window whose end is at or before
    ``closed_through_ms`` (the watermark of the last committed batch) is closed and must be in the sink once,
    with equal sums and count; the others are still open and must not be there yet. ``lost``: a closed window
    missing or holding fewer records; ``duplicated``: a window written twice, or holding more records, or the
    same count with other sums; ``unexpected``: a window row no source explains (open ones included).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    aggregate, column = transform.aggregate, transform.watermark[0]
    valid = source.where(F.col(VALID))
    if transform.dedup is not None:
        first = Window.partitionBy(*transform.dedup.key_columns).orderBy(*COORDINATES)
        valid = valid.withColumn("_n", F.row_number().over(first)).where("_n = 1").drop("_n")
    counting = aggregate.model_copy(update={"count": True})
    expected = window_rows(valid, counting, column).withColumn(
        "_closed", F.col("window_end") <= F.timestamp_millis(F.lit(closed_through_ms))
    )
    keys = ["window_start", "window_end", *aggregate.by]
    measures = [f"sum_{c}" for c in aggregate.sum]
    held = sink.select(*keys, *(F.col(m).cast(EXACT_SUM).alias(m) for m in measures),
                       (F.col("events") if aggregate.count else F.lit(None).cast("long")).alias("events"))  # fmt: skip
    per_window = held.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("_n"), F.first("events").alias("_s_events"),
        *(F.first(m).alias(f"_s_{m}") for m in measures),
    )  # fmt: skip
    x, s = expected.alias("x"), per_window.alias("s")
    on = [F.col(f"x.{k}").eqNullSafe(F.col(f"s.{k}")) for k in keys]
    same_sums = F.lit(True)
    for m in measures:
        same_sums = same_sums & F.col(f"x.{m}").eqNullSafe(F.col(f"_s_{m}"))
    closed, held_it = F.coalesce(F.col("_closed"), F.lit(False)), F.col("_n").isNotNull()
    fewer = F.col("_s_events") < F.col("x.events") if aggregate.count else F.lit(False)
    more = F.col("_s_events") > F.col("x.events") if aggregate.count else F.lit(False)
    row = (
        x.join(s, on, "full_outer")
        .agg(
            F.sum(F.when(closed, 1).otherwise(0)).alias("expected"),
            F.sum(F.when(closed & (~held_it | fewer), 1).otherwise(0)).alias("lost"),
            F.sum(F.when(closed & held_it, F.col("_n") - 1).otherwise(0)
                  + F.when(closed & held_it & (more | (~fewer & ~same_sums)), 1).otherwise(0)).alias("dup"),
            F.sum(F.when(~closed & held_it, F.col("_n")).otherwise(0)).alias("unexpected"),
            F.sum(F.coalesce(F.col("_n"), F.lit(0))).alias("sink_records"),
            F.sum(F.when(closed, F.col("x.events")).otherwise(0)).alias("aggregated"),
            F.sum(F.when(~closed & F.col("x.events").isNotNull(), F.col("x.events")).otherwise(0)).alias("pending"),
        )
        .first()
    )  # fmt: skip
    assert row is not None  # an aggregation without grouping always returns one row
    side, sink_side = _quarantine_side(source, quarantine), _sink_side(row)
    aggregated, pending = int(row["aggregated"] or 0), int(row["pending"] or 0)
    return replace(
        _counts(side, sink_side, upstream_duplicates=side["valid_records"] - aggregated - pending),
        aggregated=aggregated, pending=pending,
    )  # fmt: skip


def _sink_side(row: Any) -> dict[str, int]:
    """The sink half of the counts from one aggregated row (columns expected, lost, dup, unexpected, sink_records)."""
    return {
        "expected": int(row["expected"] or 0),
        "lost": int(row["lost"] or 0),
        "duplicated": int(row["dup"] or 0),
        "unexpected": int(row["unexpected"] or 0),
        "sink_records": int(row["sink_records"] or 0),
    }


def _counts(side: dict[str, int], sink_side: dict[str, int], *, upstream_duplicates: int = 0,
            superseded: int = 0) -> Counts:  # fmt: skip
    return Counts(
        source_records=side["source_records"],
        expected=sink_side["expected"],
        quarantined=side["quarantined"],
        upstream_duplicates=upstream_duplicates,
        sink_records=sink_side["sink_records"],
        lost=sink_side["lost"] + side["lost"],
        duplicated=sink_side["duplicated"] + side["duplicated"],
        unexpected=sink_side["unexpected"] + side["unexpected"],
        superseded=superseded,
        dropped_late=side["dropped"],
    )


def _quarantine_side(source: DataFrame, quarantine: DataFrame) -> dict[str, int]:
    """Invalid source records against the quarantine table (matched on coordinates), and source totals."""
    from pyspark.sql import functions as F

    coords = list(COORDINATES)
    dropped = F.col(DROPPED) if DROPPED in source.columns else F.lit(False)
    belongs = ~F.col(VALID) & ~F.col(DROPPED)  # expected in quarantine
    row = (
        source.select(*coords, F.col(VALID), dropped.alias(DROPPED))
        .join(quarantine.groupBy(*coords).agg(F.count(F.lit(1)).alias("n")), coords, "full_outer")
        .agg(
            F.sum(F.when(F.col(VALID).isNull() | ~belongs, F.coalesce("n", F.lit(0))).otherwise(0)).alias("u"),
            F.sum(F.when(belongs & F.col("n").isNull(), 1).otherwise(0)).alias("lost"),
            F.sum(F.when(belongs & (F.col("n") > 1), F.col("n") - 1).otherwise(0)).alias("dup"),
            F.sum(F.when(belongs & F.col("n").isNotNull(), 1).otherwise(0)).alias("quarantined"),
            F.sum(F.when(F.col(VALID).isNotNull(), 1).otherwise(0)).alias("source_records"),
            F.sum(F.when(F.col(VALID), 1).otherwise(0)).alias("valid_records"),
            F.sum(F.when(F.col(DROPPED), 1).otherwise(0)).alias("dropped"),
        )
        .first()
    )
    return {
        "unexpected": int(row["u"] or 0),
        "lost": int(row["lost"] or 0),
        "duplicated": int(row["dup"] or 0),
        "quarantined": int(row["quarantined"] or 0),
        "source_records": int(row["source_records"] or 0),
        "valid_records": int(row["valid_records"] or 0),
        "dropped": int(row["dropped"] or 0),
    }


def _identity_side(source: DataFrame, sink: DataFrame, key_columns: list[str] | None) -> dict[str, int]:
    """Sink rows against valid source records, matched on coordinates or on the dedup key."""
    from pyspark.sql import functions as F

    identity = list(key_columns) if key_columns else list(COORDINATES)
    # Per identity: is any source record with it valid / present at all?
    source_ids = source.groupBy(*identity).agg(
        F.max(F.col(VALID).cast("int")).alias("any_valid"),
    )
    sink_ids = sink.groupBy(*identity).agg(F.count(F.lit(1)).alias("n"))
    row = (
        source_ids.join(sink_ids, identity, "full_outer")
        .agg(
            F.sum(F.when(F.col("any_valid") == 1, 1).otherwise(0)).alias("expected"),
            F.sum(F.when((F.col("any_valid") == 1) & F.col("n").isNull(), 1).otherwise(0)).alias("lost"),
            F.sum(F.when((F.col("any_valid") == 1) & (F.col("n") > 1), F.col("n") - 1).otherwise(0)).alias("dup"),
            F.sum(
                F.when(F.col("any_valid").isNull() | (F.col("any_valid") == 0), F.coalesce("n", F.lit(0))).otherwise(0)
            ).alias("unexpected"),
            F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
        )
        .first()
    )
    return _sink_side(row)


def read_source(spark: SparkSession, spec: PipelineSpec, columns: list[str]) -> DataFrame:
    """The topic through the same transform as the pipeline (read_committed, earliest to latest): one row
    per source record with its coordinates, ``_valid`` and ``columns``."""
    from pyspark.sql import functions as F

    parsed = parse_records(sources.read_batch(spark, spec), spec.transform)
    return parsed.select(*COORDINATES, *columns, F.col(REJECT_REASON).isNull().alias(VALID))


def late_flags(spark: SparkSession, spec: PipelineSpec, source: DataFrame, quarantine: DataFrame | None) -> DataFrame:
    """``source`` with a boolean ``_late``: the valid records the pipeline's stateful operators dropped as late.

    Recomputed from the checkpoint's offset log: a record belongs to the batch whose offset range holds it,
    and is late when, against the watermark that batch judged late records by (the previous batch's, Spark's
    rule; :func:`streamproof.checkpoint.late_event_watermark_ms`), its event time (dedup) or its window's end
    (windows without dedup) is at or before it (:func:`streamproof.transform.late_condition`). Records no logged
    batch has read yet are not late. When the log no longer starts at batch 0 (Spark keeps the last 100
    batches; an at-most-once start wipes it), the quarantine table's ``late`` records are taken as the late ones.

    >>> late_flags(spark, spec, read_source(spark, spec, ["event_id", "event_time"]), None)  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    from streamproof.checkpoint import batch_end_offsets, late_event_watermark_ms, logged_batches
    from streamproof.transform import LATE

    transform = spec.transform
    assert transform.watermark is not None
    batches = logged_batches(spec.checkpoint_dir)
    if batches != list(range(len(batches))):
        late_ones = (
            quarantine.where(F.col("reason") == LATE).select(*COORDINATES).distinct()
            if quarantine is not None and "reason" in quarantine.columns
            else source.select(*COORDINATES).limit(0)
        )  # fmt: skip
        flagged = source.join(late_ones.withColumn(LATE_FLAG, F.lit(True)), list(COORDINATES), "left")
        return flagged.withColumn(LATE_FLAG, F.coalesce(F.col(LATE_FLAG), F.lit(False)))
    ranges: list[tuple[str, int, int, int, int]] = []
    previous: dict[str, dict[str, int]] = {}
    for batch_id in batches:
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
        (F.col("_src_topic") == F.col("_b_topic")) & (F.col("_src_partition") == F.col("_b_partition"))
        & (F.col("_src_offset") >= F.col("_b_start")) & (F.col("_src_offset") < F.col("_b_end"))
    )  # fmt: skip
    late = F.col(VALID) & (F.col("_b_watermark") > 0) & behind_watermark(transform, F.col("_b_watermark"))
    joined = source.join(batch_ranges, in_batch, "left")
    return joined.withColumn(LATE_FLAG, F.coalesce(late, F.lit(False))).drop(
        *(c for c in joined.columns if c.startswith("_b_"))
    )


def _check_columns(check: Check) -> list[str]:
    return [c for c in (check.key, check.order_by, check.by, *check.sums) if c and c not in COORDINATES]


def compare(check: Check, source: DataFrame, sink: DataFrame | None, quarantine: DataFrame,
            dedup_keys: list[str] | None = None) -> Counts:  # fmt: skip
    """Run the checker that fits the sink's :class:`Check` (a sink that does not exist yet is empty)."""
    from pyspark.sql import functions as F

    if check.kind == "totals":
        assert check.by is not None
        columns = [check.by, *check.sums]
        held = sink if sink is not None else source.select(*columns).withColumn("events", F.lit(0)).limit(0)
        return reconcile_totals(source, held, quarantine, check.by, list(check.sums))
    if check.kind == "latest":
        assert check.key is not None and check.order_by is not None
        held = sink if sink is not None else source.select(check.key, *COORDINATES).limit(0)
        return reconcile_latest(source, held, quarantine, check.key, check.order_by)
    identity = [*COORDINATES, *(dedup_keys or [])]
    held = sink.select(*identity) if sink is not None else source.select(*identity).limit(0)
    return reconcile(source, held, quarantine, key_columns=dedup_keys)


def quarantine_reasons(quarantine: DataFrame | None) -> dict[str, int]:
    """Quarantined rows per reason, as stored in the quarantine table."""
    if quarantine is None:
        return {}
    rows = quarantine.groupBy("reason").count().collect()
    return {row["reason"]: int(row["count"]) for row in sorted(rows, key=lambda r: r["reason"])}


def _read_delta(spark: SparkSession, path: Path) -> DataFrame | None:
    from delta.tables import DeltaTable

    return spark.read.format("delta").load(str(path)) if DeltaTable.isDeltaTable(spark, str(path)) else None


def verify_pipeline(spark: SparkSession, spec: PipelineSpec, manifest_dir: Path | None = None) -> list[Report]:
    """Read everything the pipeline touched and reconcile it, one report per sink (``streamproof verify``).

    >>> [report.ok for report in verify_pipeline(spark, load_pipeline("orders.toml"))]   # doctest: +SKIP
    [True]
    """
    from pyspark.sql import functions as F

    from streamproof.sinks.base import open_sinks

    sinks = open_sinks(spec)
    transform = spec.transform
    dedup, aggregate = transform.dedup, transform.aggregate
    dedup_keys = dedup.key_columns if dedup else None
    columns = list(dict.fromkeys([
        *(dedup_keys or []), *([transform.watermark[0]] if transform.watermark else []),
        *((*aggregate.by, *aggregate.sum) if aggregate else ()),
        *(c for sink in sinks for c in _check_columns(sink.check)),
    ]))  # fmt: skip
    source = read_source(spark, spec, columns)
    quarantine_table = _read_delta(spark, spec.quarantine_path)
    if transform.watermark is not None:
        flagged = late_flags(spark, spec, source, quarantine_table)
        source = flagged.withColumn(VALID, F.col(VALID) & ~F.col(LATE_FLAG)).withColumn(
            DROPPED, F.col(LATE_FLAG) & F.lit(transform.late == "drop")
        )
    source = source.cache()
    quarantine = (
        quarantine_table.select(*COORDINATES) if quarantine_table is not None
        else source.select(*COORDINATES).limit(0)
    )  # fmt: skip
    reasons = quarantine_reasons(quarantine_table)
    generated = _generated(manifest_dir, spec.source.topic) if spec.source.kind == "kafka" else None
    reports = []
    try:
        for sink in sinks:
            held = sink.read(spark)
            if aggregate is not None:
                rows = held if held is not None else spark.createDataFrame([], _window_schema(source, aggregate))
                counts = reconcile_windows(source, rows, quarantine, transform, _closed_through_ms(spec))
                unit = "windows"
            else:
                counts = compare(sink.check, source, held, quarantine, dedup_keys)
                unit = {"records": "records", "latest": "keys", "totals": "groups"}[sink.check.kind]
            reports.append(Report(
                pipeline=spec.name, guarantee=spec.guarantee, sink=sink.name, **asdict(counts), unit=unit,
                quarantine_reasons=reasons, generated=generated,
            ))  # fmt: skip
    finally:
        source.unpersist()
    return reports


def _closed_through_ms(spec: PipelineSpec) -> int:
    """The watermark of the last committed batch: the windows ending at or before it have been written."""
    from streamproof.checkpoint import batch_watermark_ms, committed_batches

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
    from streamproof.generator import load_manifest

    manifest = load_manifest(manifest_dir, topic)
    return {"records": manifest["records"], "malformed": manifest["malformed"]} if manifest else None


def reports_document(reports: list[Report]) -> dict[str, Any]:
    """The JSON document of ``verify --json``: DESIGN's report for one sink; per sink for a fan-out."""
    if len(reports) == 1:
        return reports[0].to_dict()
    return {
        "pipeline": reports[0].pipeline,
        "guarantee": reports[0].guarantee,
        "sinks": [report.to_dict() for report in reports],
        "ok": all(report.ok for report in reports),
    }
