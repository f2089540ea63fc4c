"""The checker: exact counts of lost, duplicated, quarantined and unexpected records from a few tables.

Jepsen-style, a pure function of its inputs: the source records (coordinates + whether each is valid), the sink
rows and the quarantine rows, given as DataFrames so that a 100M-record topic reconciles the same way as a hand-
made one; reading Kafka, Delta, PostgreSQL and the checkpoint happens before it (:mod:`streamproof.reconcile.history`).
The same checker serves ``verify``, ``prove``, the tests and the benchmarks; every figure is an exact count.

Rules (DESIGN.md): every valid source record must be in the sink exactly once and every invalid one
in quarantine exactly once, matched on source coordinates (topic, partition, offset), or on the
dedup key columns when the pipeline deduplicates (then ``expected`` = distinct valid keys and the
extra valid records are ``upstream_duplicates``).

* ``lost``: expected records (or keys) missing from the sink, plus invalid records missing from quarantine;
* ``duplicated``: extra rows for one record (or key), in the sink or in quarantine;
* ``unexpected``: rows no source record explains (unknown coordinates, a valid record in quarantine,
  an invalid record in the sink);
* ``source_records = expected + quarantined + upstream_duplicates + superseded + dropped_late`` (for windows,
  ``aggregated + pending`` in place of ``expected``): each term is counted on its own (expected from the source's
  distinct identities, quarantined from the quarantine table, upstream duplicates and superseded records from the
  source's key order, dropped from the late flags), so the identity is a check that can fail, not arithmetic.

Sinks that hold a *state* rather than one row per record are compared with the state the source implies
(:class:`Check`, :func:`check_for`), and count in keys or groups (``unit`` in the report):

* ``latest`` (Delta merge, PostgreSQL upsert): one row per key holding the key's latest valid record;
  a key whose row is an older record of it counts as ``lost`` (its latest update is missing); the other
  valid records of a key are ``superseded``;
* ``totals`` (PostgreSQL accumulate): one row per group with the sums and the record count ``events``;
  a group counted more times than the source has records is ``duplicated`` (an increment applied
  twice), fewer is ``lost``, equal counts with different sums (a null sum included: sums are compared
  null-safely, a null value counting as 0 in the expected ones) is a wrong value, counted in ``duplicated``
  (DESIGN.md's value mismatch) and in ``wrong_values``, and named under that kind with both values.

Example::

    >>> counts = reconcile(source, sink, quarantine)                 # doctest: +SKIP
    >>> counts.lost, counts.duplicated, counts.unexpected            # doctest: +SKIP
    (0, 0, 0)
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from streamproof.errors import ConfigError
from streamproof.reconcile.counts import DROPPED, SAMPLES, VALID, Check, Counts
from streamproof.transform.records import COORDINATES, EXACT_SUM, window_rows


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
    upstream = _after_first(source, key_columns, list(COORDINATES)) if key_columns else 0
    return _counts(side, sink_side, upstream_duplicates=upstream)


def reconcile_latest(source: DataFrame, sink: DataFrame, quarantine: DataFrame, key: str, order_by: str) -> Counts:
    """Exact counts for a sink holding the latest valid record of each ``key`` (merge, upsert).

    ``source`` needs the coordinates, ``_valid``, ``key`` and ``order_by``; ``sink`` the coordinates and ``key``.
    The latest record of a key is the greatest by ``order_by`` (null oldest), then topic, partition, offset:
    the same order the sinks apply.

    >>> reconcile_latest(source, sink, quarantine, "order_id", "event_time").lost    # doctest: +SKIP
    0
    """
    coords = list(COORDINATES)
    valid = source.where(F.col(VALID)).select(key, *coords, order_by)
    newest_first = Window.partitionBy(key).orderBy(F.col(order_by).desc_nulls_last(), *(F.desc(c) for c in coords))
    winners = (
        valid.withColumn("_rank", F.row_number().over(newest_first))
        .where("_rank = 1")
        .select(key, *(F.col(c).alias(f"_w{c}") for c in coords))
    )
    known = valid.select(key, *coords).distinct().withColumn("_known", F.lit(True))
    rows = sink.select(key, *coords).join(known, [key, *coords], "left").join(winners, key, "left")
    is_winner = F.lit(True)
    for column in coords:
        is_winner = is_winner & F.coalesce(F.col(column) == F.col(f"_w{column}"), F.lit(False))
    per_key = rows.groupBy(key).agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("_known").isNotNull().cast("int")).alias("known"),
        F.max(is_winner.cast("int")).alias("has_winner"),
    )
    joined = winners.select(key, F.lit(True).alias("_expected")).join(per_key, key, "full_outer")
    lost = F.col("_expected").isNotNull() & (F.coalesce("has_winner", F.lit(0)) == 0)
    stray_rows = F.coalesce(F.col("n") - F.col("known"), F.lit(0))  # rows no valid record of the key explains
    row = joined.agg(
        F.sum(F.col("_expected").isNotNull().cast("int")).alias("expected"),
        F.sum(F.when(lost, 1).otherwise(0)).alias("lost"),
        F.sum(F.when(F.col("known") > 1, F.col("known") - 1).otherwise(0)).alias("duplicated"),
        F.sum(stray_rows).alias("unexpected"),
        F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
    ).first()
    side, sink_side = _quarantine_side(source, quarantine), _sink_side(row)
    sink_side["samples"] = _samples(
        joined,
        sink_side,
        {
            "lost": (lost, [key, F.lit("no row with its latest record").alias("found")]),
            "duplicated": (F.col("known") > 1, [key, F.col("known").alias("rows")]),
            "unexpected": (stray_rows > 0, [key, stray_rows.alias("rows")]),
        },
    )
    newest = [F.col(order_by).desc_nulls_last(), *(F.desc(c) for c in coords)]
    return _counts(side, sink_side, superseded=_after_first(source, [key], newest))


def reconcile_totals(source: DataFrame, sink: DataFrame, quarantine: DataFrame, by: str, sums: list[str]) -> Counts:
    """Exact counts for a sink holding per-``by`` totals of ``sums`` and a record count ``events``.

    Sums are compared as ``DECIMAL(38, 10)`` on both sides, so no float rounding hides or invents a difference.

    >>> reconcile_totals(source, sink, quarantine, "customer_id", ["amount"]).duplicated    # doctest: +SKIP
    0
    """
    sink_side = _totals_side(source, sink, by, sums)
    return _counts(
        _quarantine_side(source, quarantine), sink_side, superseded=_after_first(source, [by], list(COORDINATES))
    )


def _totals_side(source: DataFrame, sink: DataFrame, by: str, sums: list[str]) -> dict[str, Any]:
    """The sink half of :func:`reconcile_totals`: per-group totals of the valid ``source`` rows against the sink's."""
    exact = "DECIMAL(38, 10)"
    expected_totals = (
        source.where(F.col(VALID))
        .groupBy(by)
        .agg(
            F.count(F.lit(1)).alias("_x_events"),
            *(F.sum(F.coalesce(F.col(c).cast(exact), F.lit(0).cast(exact))).alias(f"_x_{c}") for c in sums),
        )
    )
    held = sink.select(by, F.col("events").alias("_s_events"), *(F.col(c).cast(exact).alias(f"_s_{c}") for c in sums))
    per_group = held.groupBy(by).agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("_s_events").alias("_s_events"),
        *(F.sum(f"_s_{c}").alias(f"_s_{c}") for c in sums),
    )
    same_sums = F.lit(True)
    for column in sums:  # null-safe: a held null sum differs from every expected one (those are never null)
        same_sums = same_sums & F.col(f"_s_{column}").eqNullSafe(F.col(f"_x_{column}"))
    both = F.col("_x_events").isNotNull() & F.col("n").isNotNull()
    joined = expected_totals.join(per_group, by, "full_outer")
    lost = (F.col("_x_events").isNotNull() & F.col("n").isNull()) | (both & (F.col("_s_events") < F.col("_x_events")))
    doubled = both & (F.col("_s_events") > F.col("_x_events"))  # an increment applied twice
    wrong = both & (F.col("_s_events") == F.col("_x_events")) & ~same_sums  # the right count, another value
    row = joined.agg(
        F.sum(F.col("_x_events").isNotNull().cast("int")).alias("expected"),
        F.sum(F.when(lost, 1).otherwise(0)).alias("lost"),
        F.sum(F.when(doubled | wrong, 1).otherwise(0)).alias("duplicated"),
        F.sum(F.when(wrong, 1).otherwise(0)).alias("wrong_values"),
        F.sum(F.when(F.col("_x_events").isNull(), F.col("n")).otherwise(0)).alias("unexpected"),
        F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
    ).first()
    sink_side = {**_sink_side(row), **_counted(row, "wrong_values")}
    both_values = [
        by,
        F.col("_x_events").alias("expected_events"),
        F.col("_s_events").alias("held_events"),
        *(F.col(f"_x_{c}").alias(f"expected_{c}") for c in sums),
        *(F.col(f"_s_{c}").alias(f"held_{c}") for c in sums),
    ]
    sink_side["samples"] = _samples(
        joined,
        sink_side,
        {
            "lost": (lost, both_values),
            "duplicated": (doubled, both_values),
            "wrong_values": (wrong, both_values),
            "unexpected": (F.col("_x_events").isNull(), [by, F.col("n").alias("rows"), *both_values[2:]]),
        },
    )
    return sink_side


def reconcile_windows(
    source: DataFrame, sink: DataFrame, quarantine: DataFrame, transform: Any, closed_through_ms: int
) -> Counts:
    """Exact counts for a sink of window rows (``[transform] aggregate``), every value compared.

    The windows are recomputed from the valid, not-late source records (one per dedup key when dedup is on)
    with the pipeline's own :func:`streamproof.transform.records.window_rows`. A window whose end is at or before
    ``closed_through_ms`` (the watermark of the last committed batch) is closed and must be in the sink once,
    with equal sums and count; the others are still open and must not be there yet. ``lost``: a closed window
    missing or holding fewer records; ``duplicated``: a window written twice, or holding more records, or the
    same count with other sums; ``unexpected``: a window row no source explains (open ones included).
    """
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
    held = sink.select(
        *keys,
        *(F.col(m).cast(EXACT_SUM).alias(m) for m in measures),
        (F.col("events") if aggregate.count else F.lit(None).cast("long")).alias("events"),
    )
    per_window = held.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("_n"),
        F.first("events").alias("_s_events"),
        *(F.first(m).alias(f"_s_{m}") for m in measures),
    )
    x, s = expected.alias("x"), per_window.alias("s")
    on = [F.col(f"x.{k}").eqNullSafe(F.col(f"s.{k}")) for k in keys]
    same_sums = F.lit(True)
    for m in measures:
        same_sums = same_sums & F.col(f"x.{m}").eqNullSafe(F.col(f"_s_{m}"))
    closed, held_it = F.coalesce(F.col("_closed"), F.lit(False)), F.col("_n").isNotNull()
    fewer = F.col("_s_events") < F.col("x.events") if aggregate.count else F.lit(False)
    more = F.col("_s_events") > F.col("x.events") if aggregate.count else F.lit(False)
    lost, early = closed & (~held_it | fewer), ~closed & held_it  # early: a window written while still open
    joined = x.join(s, on, "full_outer")
    row = joined.agg(
        F.sum(F.when(closed, 1).otherwise(0)).alias("expected"),
        F.sum(F.when(lost, 1).otherwise(0)).alias("lost"),
        F.sum(
            F.when(closed & held_it, F.col("_n") - 1).otherwise(0)
            + F.when(closed & held_it & (more | (~fewer & ~same_sums)), 1).otherwise(0)
        ).alias("duplicated"),
        F.sum(F.when(early, F.col("_n")).otherwise(0)).alias("unexpected"),
        F.sum(F.coalesce(F.col("_n"), F.lit(0))).alias("sink_records"),
        F.sum(F.when(closed, F.col("x.events")).otherwise(0)).alias("aggregated"),
        F.sum(F.when(~closed & F.col("x.events").isNotNull(), F.col("x.events")).otherwise(0)).alias("pending"),
    ).first()
    assert row is not None  # an aggregation without grouping always returns one row
    side, sink_side = _quarantine_side(source, quarantine), _sink_side(row)
    windowed = _counted(row, "aggregated", "pending")
    dedup_keys = list(transform.dedup.key_columns) if transform.dedup is not None else None
    upstream_duplicates = _after_first(source, dedup_keys, list(COORDINATES)) if dedup_keys else 0
    both_values = [
        *(F.coalesce(F.col(f"x.{k}"), F.col(f"s.{k}")).alias(k) for k in keys),
        F.col("x.events").alias("expected_events"),
        F.col("_s_events").alias("held_events"),
        F.col("_n").alias("rows"),
        *(F.col(f"x.{m}").alias(f"expected_{m}") for m in measures),
        *(F.col(f"_s_{m}").alias(f"held_{m}") for m in measures),
    ]
    sink_side["samples"] = _samples(
        joined,
        sink_side,
        {
            "lost": (lost, both_values),
            "duplicated": (closed & held_it & ((F.col("_n") > 1) | more | (~fewer & ~same_sums)), both_values),
            "unexpected": (early, both_values),
        },
    )
    counts = _counts(side, sink_side, upstream_duplicates=upstream_duplicates)
    return replace(counts, aggregated=windowed["aggregated"], pending=windowed["pending"])


def _after_first(source: DataFrame, group: list[str], order: list[Any]) -> int:
    """Valid source records that come after the first of their ``group`` in ``order``: counted from the source
    alone (an upstream duplicate: its dedup key appeared at an earlier coordinate; a superseded record: its key has
    a newer one), never as a remainder of other terms, so the identity can fail. A record read twice at the same
    coordinates is neither first nor after it: the identity then shows it as unaccounted for."""
    here = F.struct(*COORDINATES)
    first = F.first(here).over(Window.partitionBy(*group).orderBy(*order))
    after = source.where(F.col(VALID)).select(here.alias("_at"), (here != first).alias("_after"))
    return after.where("_after").select("_at").distinct().count()


def _counted(row: Any, *names: str) -> dict[str, int]:
    """Named sums of one aggregated row, as exact integers (a sum over no rows is null: 0)."""
    return {name: int(row[name] or 0) for name in names}


def _samples(
    rows: DataFrame, counted: dict[str, Any], kinds: dict[str, tuple[Column, list[Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Up to :data:`SAMPLES` rows of each kind of damage that was counted, in a stable order; a count of 0 costs
    no Spark job, so a clean reconciliation is as fast as before."""
    found = {}
    for kind, (condition, columns) in kinds.items():
        if counted.get(kind):
            picked = rows.where(condition).select(*columns)
            named = [
                {name: _plain(value) for name, value in row.asDict().items()}
                for row in picked.orderBy(*picked.columns).limit(SAMPLES).collect()
            ]
            if named:  # duplicated may count only wrong values, which are named under their own kind
                found[kind] = named
    return found


def _plain(value: Any) -> Any:
    """A value JSON writes as is: exact decimals and timestamps as text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return value.isoformat() if isinstance(value, datetime | date) else str(value)


def _merged(*parts: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Samples of the quarantine and the sink side together, still at most :data:`SAMPLES` of each kind."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        for kind, rows in part.items():
            merged[kind] = (merged.get(kind, []) + rows)[:SAMPLES]
    return merged


def _sink_side(row: Any) -> dict[str, Any]:
    """The sink half of the counts from one aggregated row."""
    return _counted(row, "expected", "lost", "duplicated", "unexpected", "sink_records")


def _counts(
    side: dict[str, Any], sink_side: dict[str, Any], *, upstream_duplicates: int = 0, superseded: int = 0
) -> Counts:
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
        quarantine_lost=side["lost"],
        wrong_values=sink_side.get("wrong_values", 0),
        samples=_merged(side["samples"], sink_side["samples"]),
    )


def _quarantine_side(source: DataFrame, quarantine: DataFrame) -> dict[str, Any]:
    """Invalid source records against the quarantine table (matched on coordinates), and source totals."""
    coords = list(COORDINATES)
    dropped = F.col(DROPPED) if DROPPED in source.columns else F.lit(False)
    belongs = ~F.col(VALID) & ~F.col(DROPPED)  # expected in quarantine
    # One row per coordinate, so a record read twice counts twice in the source but once in every other term.
    per_record = source.groupBy(*coords).agg(
        F.count(F.lit(1)).alias("_reads"),
        (F.max(F.col(VALID).cast("int")) == 1).alias(VALID),
        (F.max(dropped.cast("int")) == 1).alias(DROPPED),
    )
    joined = per_record.join(quarantine.groupBy(*coords).agg(F.count(F.lit(1)).alias("n")), coords, "full_outer")
    stray = F.col(VALID).isNull() | ~belongs
    missing, doubled = belongs & F.col("n").isNull(), belongs & (F.col("n") > 1)
    row = joined.agg(
        F.sum(F.when(stray, F.coalesce("n", F.lit(0))).otherwise(0)).alias("unexpected"),
        F.sum(F.when(missing, 1).otherwise(0)).alias("lost"),
        F.sum(F.when(doubled, F.col("n") - 1).otherwise(0)).alias("duplicated"),
        F.sum(F.when(belongs & F.col("n").isNotNull(), 1).otherwise(0)).alias("quarantined"),
        F.sum(F.coalesce("_reads", F.lit(0))).alias("source_records"),
        F.sum(F.when(F.col(DROPPED), 1).otherwise(0)).alias("dropped"),
    ).first()
    names = ("unexpected", "lost", "duplicated", "quarantined", "source_records", "dropped")
    counted: dict[str, Any] = _counted(row, *names)
    where = [*coords, F.lit("quarantine").alias("in")]
    counted["samples"] = _samples(
        joined,
        counted,
        {
            "lost": (missing, where),
            "duplicated": (doubled, [*where, F.col("n").alias("rows")]),
            "unexpected": (
                stray & F.col("n").isNotNull(),
                [*where, F.col("n").alias("rows"), F.col(VALID).alias("valid")],
            ),
        },
    )
    return counted


def _identity_side(source: DataFrame, sink: DataFrame, key_columns: list[str] | None) -> dict[str, Any]:
    """Sink rows against valid source records, matched on coordinates or on the dedup key."""
    identity = list(key_columns) if key_columns else list(COORDINATES)
    # Per identity: is any source record with it valid / present at all?
    source_ids = source.groupBy(*identity).agg(
        F.max(F.col(VALID).cast("int")).alias("any_valid"),
    )
    sink_ids = sink.groupBy(*identity).agg(F.count(F.lit(1)).alias("n"))
    joined = source_ids.join(sink_ids, identity, "full_outer")
    expected = F.coalesce(F.col("any_valid") == 1, F.lit(False))  # a sink identity no source has: not expected
    missing, doubled = expected & F.col("n").isNull(), expected & (F.col("n") > 1)
    row = joined.agg(
        F.sum(F.when(expected, 1).otherwise(0)).alias("expected"),
        F.sum(F.when(missing, 1).otherwise(0)).alias("lost"),
        F.sum(F.when(doubled, F.col("n") - 1).otherwise(0)).alias("duplicated"),
        F.sum(F.when(~expected, F.coalesce("n", F.lit(0))).otherwise(0)).alias("unexpected"),
        F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
    ).first()
    counted = _sink_side(row)
    rows = F.col("n").alias("rows")
    counted["samples"] = _samples(
        joined,
        counted,
        {
            "lost": (missing, identity),
            "duplicated": (doubled, [*identity, rows]),
            "unexpected": (~expected & F.col("n").isNotNull(), [*identity, rows]),
        },
    )
    return counted


def compare(
    check: Check, source: DataFrame, sink: DataFrame | None, quarantine: DataFrame, dedup_keys: list[str] | None = None
) -> Counts:
    """Run the checker that fits the sink's :class:`Check` (a sink that does not exist yet is empty)."""
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


def compare_rows(
    check: Check, source: DataFrame, rows: DataFrame, sink: DataFrame | None, quarantine: DataFrame
) -> Counts:
    """The checker for a pipeline with your own transform (:mod:`streamproof.your_code.transform`): the sink is
    compared with ``rows``, what the code makes of the valid source records (the oracle), in the sink's :class:`Check`;
    the quarantine side and the identity stay on the source records (``transformed``: the valid records the code got).

    * ``records``: a multiset of rows, every column both hold compared (lineage included): an expected row the sink
      holds fewer times is ``lost``, more times ``duplicated``, a row no expected row equals ``unexpected`` (a row
      with the right lineage and another value is both: lost in its expected form, unexpected in the held one);
    * ``latest``: per key, the latest expected row (by ``order_by``, then lineage), every column both hold compared:
      a key holding another row is a wrong value (counted in ``duplicated`` and ``wrong_values``, with both rows);
    * ``totals``: per group, the sums of the expected rows.

    >>> compare_rows(Check("records"), source, expected, sink_rows, quarantine).lost    # doctest: +SKIP
    0
    """
    needed = [*COORDINATES] if check.kind != "totals" else []
    needed += [c for c in (check.key if check.kind == "latest" else check.by,) if c]
    missing = [c for c in needed if sink is not None and c not in sink.columns]
    if missing:
        raise ConfigError(
            f"the sink's rows lack {', '.join(missing)}, which verification matches them to their "
            "records by: keep them in what the sink writes (your sink: in what its read returns)"
        )
    side = _quarantine_side(source, quarantine)
    transformed = source.where(F.col(VALID)).count()
    columns = [c for c in rows.columns if sink is None or c in sink.columns]  # every column both hold
    if sink is None:
        sink = rows.limit(0)
    held = sink.select(*(F.col(c).cast(rows.schema[c].dataType).alias(c) for c in columns))
    if check.kind == "totals":
        assert check.by is not None
        sink_side = _totals_side(rows.withColumn(VALID, F.lit(True)), sink, check.by, list(check.sums))
        superseded = 0
    elif check.kind == "latest":
        assert check.key is not None and check.order_by is not None
        sink_side, superseded = _latest_rows_side(rows.select(*columns), held, check.key, check.order_by)
    else:
        sink_side, superseded = _rows_side(rows.select(*columns), held), 0
    counts = _counts(side, sink_side, superseded=superseded)
    return replace(counts, transformed=transformed, your_code=True)


def _row_text(columns: list[str]) -> Column:
    """A row as one comparable value: its columns as JSON, in order (a null is left out, the same on both sides)."""
    return F.to_json(F.struct(*columns))


def _rows_side(rows: DataFrame, held: DataFrame) -> dict[str, Any]:
    columns = rows.columns
    expected = rows.groupBy(_row_text(columns).alias("_row")).agg(
        F.count(F.lit(1)).alias("x"), *(F.first(c).alias(c) for c in COORDINATES)
    )
    found = held.groupBy(_row_text(columns).alias("_row")).agg(
        F.count(F.lit(1)).alias("n"), *(F.first(c).alias(f"_h{c}") for c in COORDINATES)
    )
    joined = expected.join(found, "_row", "full_outer")
    x, n = F.coalesce("x", F.lit(0)), F.coalesce("n", F.lit(0))
    lost, doubled, stray = (x > n), (x > 0) & (n > x), (x == 0) & (n > 0)
    row = joined.agg(
        F.sum(x).alias("expected"),
        F.sum(F.when(lost, x - n).otherwise(0)).alias("lost"),
        F.sum(F.when(doubled, n - x).otherwise(0)).alias("duplicated"),
        F.sum(F.when(stray, n).otherwise(0)).alias("unexpected"),
        F.sum(n).alias("sink_records"),
    ).first()
    counted = _sink_side(row)
    at = [F.coalesce(F.col(c), F.col(f"_h{c}")).alias(c) for c in COORDINATES]
    counted["samples"] = _samples(
        joined,
        counted,
        {
            "lost": (lost, [*at, (x - n).alias("rows"), F.col("_row").alias("row")]),
            "duplicated": (doubled, [*at, (n - x).alias("extra"), F.col("_row").alias("row")]),
            "unexpected": (stray, [*at, n.alias("rows"), F.col("_row").alias("row")]),
        },
    )
    return counted


def _latest_rows_side(rows: DataFrame, held: DataFrame, key: str, order_by: str) -> tuple[dict[str, Any], int]:
    columns = rows.columns
    newest = Window.partitionBy(key).orderBy(F.col(order_by).desc_nulls_last(), *(F.desc(c) for c in COORDINATES))
    ranked = rows.withColumn("_rank", F.row_number().over(newest))
    winners = ranked.where("_rank = 1").select(key, _row_text(columns).alias("_x"))
    superseded = ranked.where("_rank > 1").count()
    per_key = held.groupBy(key).agg(F.count(F.lit(1)).alias("n"), F.min(_row_text(columns)).alias("_s"))
    joined = winners.join(per_key, key, "full_outer")
    both = F.col("_x").isNotNull() & F.col("n").isNotNull()
    lost, stray = F.col("_x").isNotNull() & F.col("n").isNull(), F.col("_x").isNull() & F.col("n").isNotNull()
    wrong = both & (F.col("n") == 1) & (F.col("_x") != F.col("_s"))
    extra = F.when(both & (F.col("n") > 1), F.col("n") - 1).otherwise(0)
    row = joined.agg(
        F.sum(F.col("_x").isNotNull().cast("int")).alias("expected"),
        F.sum(F.when(lost, 1).otherwise(0)).alias("lost"),
        F.sum(extra + F.when(wrong, 1).otherwise(0)).alias("duplicated"),
        F.sum(F.when(wrong, 1).otherwise(0)).alias("wrong_values"),
        F.sum(F.when(stray, F.col("n")).otherwise(0)).alias("unexpected"),
        F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
    ).first()
    counted = {**_sink_side(row), **_counted(row, "wrong_values")}
    both_rows = [key, F.col("_x").alias("expected_row"), F.col("_s").alias("held_row")]
    counted["samples"] = _samples(
        joined,
        counted,
        {
            "lost": (lost, both_rows),
            "duplicated": (extra > 0, [*both_rows, F.col("n").alias("rows")]),
            "wrong_values": (wrong, both_rows),
            "unexpected": (stray, [*both_rows, F.col("n").alias("rows")]),
        },
    )
    return counted, superseded
