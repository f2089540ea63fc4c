"""The checker on hand-made datasets: each kind of damage gives its exact count."""

from __future__ import annotations

from typing import Any

from conftest import LATE_TIMES, UNLOGGED_TIMES, late_checkpoint, unlogged_checkpoint
from streamproof.reconcile.checker import reconcile
from streamproof.reconcile.counts import Counts

SOURCE_SCHEMA = "_src_topic STRING, _src_partition INT, _src_offset LONG, event_id STRING, _valid BOOLEAN"
COORDS_SCHEMA = "_src_topic STRING, _src_partition INT, _src_offset LONG"


def _source(spark: Any, valid: int, invalid: int) -> Any:
    rows = [("t", 0, i, f"e{i}", True) for i in range(valid)]
    rows += [("t", 1, i, None, False) for i in range(invalid)]
    return spark.createDataFrame(rows, SOURCE_SCHEMA)


def _coords(spark: Any, rows: list[tuple[str, int, int]]) -> Any:
    return spark.createDataFrame(rows, COORDS_SCHEMA)


def _perfect(valid: int, invalid: int) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    return [("t", 0, i) for i in range(valid)], [("t", 1, i) for i in range(invalid)]


def test_perfect_delivery_is_clean(spark: Any) -> None:
    sink, quarantine = _perfect(10, 3)
    counts = reconcile(_source(spark, 10, 3), _coords(spark, sink), _coords(spark, quarantine))
    assert counts == Counts(
        source_records=13,
        expected=10,
        quarantined=3,
        upstream_duplicates=0,
        sink_records=10,
        lost=0,
        duplicated=0,
        unexpected=0,
    )


def test_lost_duplicated_and_unexpected_sink_rows_are_counted_exactly(spark: Any) -> None:
    sink, quarantine = _perfect(10, 3)
    sink.remove(("t", 0, 4))  # 1 lost
    sink.remove(("t", 0, 5))  # 2 lost
    sink += [("t", 0, 7), ("t", 0, 7), ("t", 0, 8)]  # 3 duplicated
    sink += [("t", 0, 99), ("other", 0, 1)]  # 2 unexpected
    counts = reconcile(_source(spark, 10, 3), _coords(spark, sink), _coords(spark, quarantine))
    assert (counts.lost, counts.duplicated, counts.unexpected) == (2, 3, 2)
    assert counts.sink_records == 13
    # What, not only how many: the report names each damaged record by its coordinates.
    named = {kind: [(r["_src_topic"], r["_src_partition"], r["_src_offset"], r.get("rows")) for r in rows]
             for kind, rows in counts.samples.items()}  # fmt: skip
    assert named == {"lost": [("t", 0, 4, None), ("t", 0, 5, None)], "duplicated": [("t", 0, 7, 3), ("t", 0, 8, 2)],
                     "unexpected": [("other", 0, 1, 1), ("t", 0, 99, 1)]}  # fmt: skip


def test_a_clean_reconciliation_names_nothing_and_names_at_most_twenty(spark: Any) -> None:
    from streamproof.reconcile.counts import SAMPLES

    sink, quarantine = _perfect(50, 0)
    assert reconcile(_source(spark, 50, 0), _coords(spark, sink), _coords(spark, quarantine)).samples == {}
    counts = reconcile(_source(spark, 50, 0), _coords(spark, []), _coords(spark, quarantine))
    assert counts.lost == 50
    assert [r["_src_offset"] for r in counts.samples["lost"]] == list(range(SAMPLES))


def test_quarantine_damage_counts_too(spark: Any) -> None:
    sink, quarantine = _perfect(10, 3)
    quarantine.remove(("t", 1, 0))  # an invalid record nowhere: lost
    quarantine.append(("t", 1, 2))  # quarantined twice: duplicated
    quarantine.append(("t", 0, 3))  # a valid record in quarantine: unexpected
    sink.append(("t", 1, 1))  # an invalid record in the sink: unexpected
    counts = reconcile(_source(spark, 10, 3), _coords(spark, sink), _coords(spark, quarantine))
    assert (counts.lost, counts.duplicated, counts.unexpected) == (1, 1, 2)
    assert counts.quarantined == 2
    assert [(r["_src_offset"], r.get("in")) for r in counts.samples["lost"]] == [(0, "quarantine")]
    assert [(r["_src_offset"], r.get("in")) for r in counts.samples["unexpected"]] == [(3, "quarantine"), (1, None)]


def test_empty_sink_loses_everything(spark: Any) -> None:
    counts = reconcile(_source(spark, 5, 2), _coords(spark, []), _coords(spark, []))
    assert (counts.expected, counts.lost, counts.quarantined) == (5, 7, 0)


def test_dedup_key_matching_counts_upstream_duplicates_and_extra_rows(spark: Any) -> None:
    # Source: e0..e4 valid, e1 and e2 resent (upstream duplicates); one invalid record.
    rows = [("t", 0, i, f"e{i}", True) for i in range(5)]
    rows += [("t", 0, 5, "e1", True), ("t", 0, 6, "e2", True), ("t", 1, 0, None, False)]
    source = spark.createDataFrame(rows, SOURCE_SCHEMA)
    sink = spark.createDataFrame(
        [("e0",), ("e1",), ("e2",), ("e2",), ("e4",), ("zz",)], "event_id STRING"
    )  # e3 lost, e2 doubled, zz unexpected
    counts = reconcile(source, sink, _coords(spark, [("t", 1, 0)]), key_columns=["event_id"])
    assert counts.expected == 5
    assert counts.upstream_duplicates == 2
    assert (counts.lost, counts.duplicated, counts.unexpected) == (1, 1, 1)
    assert counts.source_records == counts.expected + counts.quarantined + counts.upstream_duplicates
    assert counts.samples == {"lost": [{"event_id": "e3"}], "duplicated": [{"event_id": "e2", "rows": 2}],
                              "unexpected": [{"event_id": "zz", "rows": 1}]}  # fmt: skip


LATEST_SOURCE = (
    "_src_topic STRING, _src_partition INT, _src_offset LONG, order_id STRING, event_time STRING, _valid BOOLEAN"
)
LATEST_SINK = "_src_topic STRING, _src_partition INT, _src_offset LONG, order_id STRING"


def _order_history(spark: Any) -> Any:
    """Three orders with several events each (the latest by event_time wins), and one invalid record."""
    rows = [
        ("t", 0, 0, "o1", "2026-01-01 00:00:01", True),
        ("t", 0, 1, "o1", "2026-01-01 00:00:03", True),  # o1's latest
        ("t", 1, 0, "o1", "2026-01-01 00:00:02", True),
        ("t", 1, 1, "o2", "2026-01-01 00:00:05", True),  # o2's only event
        ("t", 0, 2, "o3", None, True),
        ("t", 1, 2, "o3", "2026-01-01 00:00:04", True),  # o3's latest: a null event time is the oldest
        ("t", 1, 3, None, None, False),
    ]
    return spark.createDataFrame(rows, LATEST_SOURCE)


def test_latest_state_per_key_is_clean_when_each_key_holds_its_newest_record(spark: Any) -> None:
    from streamproof.reconcile.checker import reconcile_latest

    sink = spark.createDataFrame([("t", 0, 1, "o1"), ("t", 1, 1, "o2"), ("t", 1, 2, "o3")], LATEST_SINK)
    counts = reconcile_latest(_order_history(spark), sink, _coords(spark, [("t", 1, 3)]), "order_id", "event_time")
    assert counts == Counts(source_records=7, expected=3, quarantined=1, upstream_duplicates=0, sink_records=3,
                            lost=0, duplicated=0, unexpected=0, superseded=3)  # fmt: skip


def test_latest_state_counts_a_stale_key_as_lost_and_extra_rows_exactly(spark: Any) -> None:
    from streamproof.reconcile.checker import reconcile_latest

    sink = [
        ("t", 0, 0, "o1"),  # an older record of o1: its latest update was lost
        ("t", 1, 1, "o2"), ("t", 1, 1, "o2"),  # o2 twice: duplicated
        ("t", 9, 9, "o3"),  # a row no source record of o3 explains: unexpected, and o3's latest is missing
        ("t", 0, 1, "o9"),  # a key the source never had: unexpected
    ]  # fmt: skip
    counts = reconcile_latest(_order_history(spark), spark.createDataFrame(sink, LATEST_SINK),
                              _coords(spark, [("t", 1, 3)]), "order_id", "event_time")  # fmt: skip
    assert (counts.lost, counts.duplicated, counts.unexpected) == (2, 1, 2)
    keys = {kind: [r["order_id"] for r in rows] for kind, rows in counts.samples.items()}
    assert keys == {"lost": ["o1", "o3"], "duplicated": ["o2"], "unexpected": ["o3", "o9"]}


TOTALS_SOURCE = (
    "_src_topic STRING, _src_partition INT, _src_offset LONG, customer_id STRING, amount DOUBLE, _valid BOOLEAN"
)
TOTALS_SINK = "customer_id STRING, amount DECIMAL(38, 10), events LONG"


def test_totals_per_group_count_double_counting_and_loss_exactly(spark: Any) -> None:
    from decimal import Decimal

    from streamproof.reconcile.checker import reconcile_totals

    source = spark.createDataFrame(
        [("t", 0, 0, "c1", 0.1, True), ("t", 0, 1, "c1", 0.2, True), ("t", 0, 2, "c2", 5.0, True),
         ("t", 0, 3, "c3", 1.25, True), ("t", 0, 4, "c4", 2.0, True), ("t", 0, 5, None, None, False)],
        TOTALS_SOURCE,
    )  # fmt: skip
    clean = [("c1", Decimal("0.3"), 2), ("c2", Decimal("5"), 1), ("c3", Decimal("1.25"), 1), ("c4", Decimal("2"), 1)]
    quarantine = _coords(spark, [("t", 0, 5)])
    counts = reconcile_totals(source, spark.createDataFrame(clean, TOTALS_SINK), quarantine, "customer_id", ["amount"])
    assert (counts.expected, counts.lost, counts.duplicated, counts.unexpected, counts.superseded) == (4, 0, 0, 0, 1)

    damaged = [
        ("c1", Decimal("0.5"), 3),  # an increment applied twice: duplicated
        ("c2", Decimal("5"), 1),
        ("c3", Decimal("9.99"), 1),  # the right count with the wrong sum: a value mismatch counts as duplicated
        ("c9", Decimal("1"), 1),  # a group the source never had: unexpected
    ]  # c4 missing: lost
    damaged_sink = spark.createDataFrame(damaged, TOTALS_SINK)
    counts = reconcile_totals(source, damaged_sink, quarantine, "customer_id", ["amount"])
    assert (counts.lost, counts.duplicated, counts.unexpected) == (1, 2, 1)
    # Both values of each wrong group, exact decimals as text (JSON keeps them exact); c3's wrong sum is named as
    # a wrong value (counted in duplicated, and in wrong_values), c1's double increment as a duplicate.
    assert counts.wrong_values == 1
    (c1,) = counts.samples["duplicated"]
    (c3,) = counts.samples["wrong_values"]
    assert (c1["customer_id"], c1["expected_events"], c1["held_events"]) == ("c1", 2, 3)
    assert (c3["customer_id"], c3["expected_amount"], c3["held_amount"]) == ("c3", "1.2500000000", "9.9900000000")
    assert [r["customer_id"] for r in counts.samples["lost"]] == ["c4"]
    assert [(r["customer_id"], r["rows"]) for r in counts.samples["unexpected"]] == [("c9", 1)]


def test_a_null_total_is_a_wrong_value_and_an_all_null_group_holding_0_is_clean(spark: Any) -> None:
    """The reported run: c1 null then 3.0, c2 5.0 then 1.0 (c3 only null). A null amount counts as 0 in the expected
    totals; a held NULL total (``NULL + 3.0`` in the old sink) is compared null-safely: a wrong value, named with both
    values, as the independent checker names it (tests/test_pure_checker.py), not passed as "neither equal nor not"."""
    from decimal import Decimal

    from streamproof.reconcile.checker import reconcile_totals

    source = spark.createDataFrame(
        [("t", 0, 0, "c1", None, True), ("t", 0, 1, "c2", 5.0, True), ("t", 0, 2, "c1", 3.0, True),
         ("t", 0, 3, "c2", 1.0, True), ("t", 0, 4, "c3", None, True)],
        TOTALS_SOURCE,
    )  # fmt: skip
    right = [("c1", Decimal("3"), 2), ("c2", Decimal("6"), 2), ("c3", Decimal("0"), 1)]
    no_quarantine = _coords(spark, [])
    clean = reconcile_totals(source, spark.createDataFrame(right, TOTALS_SINK), no_quarantine, "customer_id",
                             ["amount"])  # fmt: skip
    assert (clean.lost, clean.duplicated, clean.wrong_values, clean.unexpected, clean.samples) == (0, 0, 0, 0, {})

    poisoned = spark.createDataFrame([("c1", None, 2), *right[1:]], TOTALS_SINK)
    counts = reconcile_totals(source, poisoned, no_quarantine, "customer_id", ["amount"])
    assert (counts.lost, counts.duplicated, counts.wrong_values, counts.unexpected) == (0, 1, 1, 0)
    assert counts.samples == {"wrong_values": [{"customer_id": "c1", "expected_events": 2, "held_events": 2,
                                                "expected_amount": "3.0000000000", "held_amount": None}]}  # fmt: skip


def test_late_records_dropped_by_configuration_are_counted_and_expected_nowhere(spark: Any) -> None:
    # e0..e3 valid; e4 and e5 late with dedup.late = "drop" (_valid false, _dropped true); one invalid record.
    rows = [("t", 0, i, f"e{i}", True, False) for i in range(4)]
    rows += [("t", 0, 4, "e4", False, True), ("t", 0, 5, "e5", False, True), ("t", 1, 0, None, False, False)]
    source = spark.createDataFrame(rows, SOURCE_SCHEMA + ", _dropped BOOLEAN")
    sink = spark.createDataFrame([("e0",), ("e1",), ("e2",), ("e3",)], "event_id STRING")
    counts = reconcile(source, sink, _coords(spark, [("t", 1, 0)]), key_columns=["event_id"])
    assert (counts.expected, counts.quarantined, counts.dropped_late, counts.upstream_duplicates) == (4, 1, 2, 0)
    assert (counts.lost, counts.duplicated, counts.unexpected) == (0, 0, 0)
    # A dropped record that turns up in quarantine or in the sink is unexpected there.
    sink_with_late = spark.createDataFrame([("e0",), ("e1",), ("e2",), ("e3",), ("e4",)], "event_id STRING")
    counts = reconcile(source, sink_with_late, _coords(spark, [("t", 1, 0), ("t", 0, 5)]), key_columns=["event_id"])
    assert (counts.lost, counts.duplicated, counts.unexpected) == (0, 0, 2)


def test_late_flags_follow_each_batch_offset_range_and_the_previous_batch_watermark(spark: Any, tmp_path: Any) -> None:
    """Batch 0 reads offsets 0-2, batch 1 offsets 3-5, batch 2 offsets 6-7 of one partition; the watermark logged
    for batch 0 is 0 and for batch 1 is 00:10. Spark judges batch N's late records by batch N-1's watermark: so
    nothing in batches 0 and 1 is late, and in batch 2 only the valid record at or before 00:10 is."""
    from pyspark.sql import functions as F

    from streamproof.reconcile.counts import LATE_FLAG
    from streamproof.reconcile.history import late_flags

    spec = late_checkpoint(tmp_path)
    # offset 8 lies beyond the last logged batch: not read yet, so not late whatever its time.
    times = LATE_TIMES
    rows = [("t", 0, offset, f"e{offset}", f"2026-01-01 {t}", True) for offset, t in enumerate(times)]
    rows.append(("t", 0, 9, None, "2026-01-01 00:00", False))  # invalid: never late
    source = spark.createDataFrame(rows, "_src_topic STRING, _src_partition INT, _src_offset LONG, event_id STRING, "
                                         "event_time STRING, _valid BOOLEAN")  # fmt: skip
    source = source.withColumn("event_time", F.to_timestamp("event_time"))
    flagged = late_flags(spark, spec, source, None)
    late = sorted(row["_src_offset"] for row in flagged.where(F.col(LATE_FLAG)).collect())
    assert late == [6]
    assert flagged.count() == source.count()


def test_a_truncated_offset_log_recomputes_its_batches_and_leaves_the_older_records_to_the_sink(
    spark: Any, tmp_path: Any
) -> None:
    """The offset log starts at batch 3 (conftest's UNLOGGED_TIMES). With dedup.late = "drop": the logged batches are
    recomputed (6 and 9 late), batches 0-3's records older than batch 3's watermark (1, 2, 4) may have been late; the
    sink holds 2 and 4 (delivered), not 1 (taken as dropped, the one record not checked): 0 lost, 3 dropped late, as
    the independent checker counts (tests/test_pure_checker.py). The old fallback took the quarantine table's late
    records for all of them: none, so 1, 6 and 9 were lost. With late = "quarantine" the table says which of 1, 2, 4
    were late (1), and its listing 7, a logged batch's record on time, is not trusted."""
    from pyspark.sql import functions as F

    from streamproof.reconcile.counts import DROPPED, LATE_FLAG, MAYBE_LATE, VALID
    from streamproof.reconcile.history import late_flags, maybe_late_resolved

    rows = [("t", 0, offset, f"e{offset}", f"2026-01-01 {t}", True) for offset, t in enumerate(UNLOGGED_TIMES)]
    source = spark.createDataFrame(rows, "_src_topic STRING, _src_partition INT, _src_offset LONG, event_id STRING, "
                                         "event_time STRING, _valid BOOLEAN")  # fmt: skip
    source = source.withColumn("event_time", F.to_timestamp("event_time"))

    def offsets(frame: Any, condition: Any) -> list[int]:
        return sorted(row["_src_offset"] for row in frame.where(condition).collect())

    flagged = late_flags(spark, unlogged_checkpoint(tmp_path / "drop", "drop"), source, None)
    assert flagged.count() == source.count()
    assert (offsets(flagged, F.col(LATE_FLAG)), offsets(flagged, F.col(MAYBE_LATE))) == ([6, 9], [1, 2, 4])
    judged = flagged.withColumn(VALID, F.col(VALID) & ~F.col(LATE_FLAG)).withColumn(DROPPED, F.col(LATE_FLAG))
    held = spark.createDataFrame([(f"e{i}",) for i in (0, 2, 3, 4, 5, 7, 8, 10, 11)], "event_id STRING")
    judged, unseen = maybe_late_resolved(judged, held, ["event_id"])
    assert (unseen, offsets(judged, F.col(DROPPED))) == (1, [1, 6, 9])
    counts = reconcile(judged, held, _coords(spark, []), key_columns=["event_id"])
    assert (counts.source_records, counts.expected, counts.dropped_late) == (12, 9, 3)
    assert (counts.lost, counts.duplicated, counts.unexpected) == (0, 0, 0)

    listed = spark.createDataFrame([("t", 0, offset, "late") for offset in (1, 6, 7, 9)],
                                   f"{COORDS_SCHEMA}, reason STRING")  # fmt: skip
    flagged = late_flags(spark, unlogged_checkpoint(tmp_path / "quarantine", "quarantine"), source, listed)
    assert offsets(flagged, F.col(LATE_FLAG)) == [1, 6, 9]


def test_window_rows_are_compared_value_by_value(spark: Any) -> None:
    """Records in three 1-minute windows of group a, one of group b; the watermark closed 00:00-00:02 only.
    The sink holds: window 00:00 a right, window 00:01 a with a wrong sum (same count), window 00:00 b twice,
    and the still-open window 00:02 a; so 1 duplicated for the sum, 1 for the second b row, 1 unexpected."""
    from pyspark.sql import functions as F

    from streamproof.config import parse_pipeline
    from streamproof.reconcile.checker import reconcile_windows

    spec = parse_pipeline("""
name = "w"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "g STRING, amount DOUBLE, event_time TIMESTAMP"
required = ["event_time"]
aggregate = { window = "1 minute", by = ["g"], sum = ["amount"], watermark = "event_time", delay = "1 minute" }
[sink]
kind = "delta"
path = "/tmp/unused"
""")
    rows = [("t", 0, 0, "a", 1.25, "00:00:10"), ("t", 0, 1, "a", 2.5, "00:00:50"), ("t", 0, 2, "a", 4.0, "00:01:30"),
            ("t", 0, 3, "a", 8.0, "00:02:30"), ("t", 0, 4, "b", 16.0, "00:00:20")]  # fmt: skip
    source = spark.createDataFrame(
        [(*r[:5], f"2026-01-01 {r[5]}", True) for r in rows],
        "_src_topic STRING, _src_partition INT, _src_offset LONG, g STRING, amount DOUBLE, event_time STRING, "
        "_valid BOOLEAN",
    ).withColumn("event_time", F.to_timestamp("event_time"))
    sink_rows = [("00:00", "00:01", "a", "3.75", 2), ("00:01", "00:02", "a", "4.5", 1),  # 4.0 expected
                 ("00:00", "00:01", "b", "16", 1), ("00:00", "00:01", "b", "16", 1),
                 ("00:02", "00:03", "a", "8", 1)]  # fmt: skip
    sink = spark.createDataFrame(
        [(f"2026-01-01 {a}:00", f"2026-01-01 {b}:00", g, total, n) for a, b, g, total, n in sink_rows],
        "window_start STRING, window_end STRING, g STRING, sum_amount STRING, events LONG",
    ).select(F.to_timestamp("window_start").alias("window_start"), F.to_timestamp("window_end").alias("window_end"),
             "g", F.col("sum_amount").cast("DECIMAL(38, 10)").alias("sum_amount"), "events")  # fmt: skip
    closed_through = 1767225720000  # 2026-01-01T00:02:00Z
    counts = reconcile_windows(source, sink, _coords(spark, []), spec.transform, closed_through)
    assert (counts.expected, counts.lost, counts.duplicated, counts.unexpected) == (3, 0, 2, 1)
    assert (counts.aggregated, counts.pending, counts.sink_records) == (4, 1, 5)
    wrong = [(r["g"], r["window_start"][11:16], r["expected_sum_amount"], r["held_sum_amount"], r["rows"])
             for r in counts.samples["duplicated"]]  # fmt: skip
    assert wrong == [("b", "00:00", "16.0000000000", "16.0000000000", 2),  # in window order
                     ("a", "00:01", "4.0000000000", "4.5000000000", 1)]  # fmt: skip
    assert [(r["g"], r["window_start"][11:16]) for r in counts.samples["unexpected"]] == [("a", "00:02")]
    # The sink missing a closed window, or holding fewer records in one, is loss.
    fewer = sink.where(~((F.col("g") == "b") | (F.col("sum_amount") == 4.5)))
    counts = reconcile_windows(source, fewer, _coords(spark, []), spec.transform, closed_through)
    assert (counts.lost, counts.duplicated, counts.unexpected) == (2, 0, 1)
