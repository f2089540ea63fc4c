"""The checker on hand-made datasets: each kind of damage gives its exact count."""

from __future__ import annotations

from typing import Any

from streamproof.verify import Counts, reconcile

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


def test_quarantine_damage_counts_too(spark: Any) -> None:
    sink, quarantine = _perfect(10, 3)
    quarantine.remove(("t", 1, 0))  # an invalid record nowhere: lost
    quarantine.append(("t", 1, 2))  # quarantined twice: duplicated
    quarantine.append(("t", 0, 3))  # a valid record in quarantine: unexpected
    sink.append(("t", 1, 1))  # an invalid record in the sink: unexpected
    counts = reconcile(_source(spark, 10, 3), _coords(spark, sink), _coords(spark, quarantine))
    assert (counts.lost, counts.duplicated, counts.unexpected) == (1, 1, 2)
    assert counts.quarantined == 2


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
