"""The identity ``source = expected + quarantined + upstream dups (+ superseded, dropped late)`` can fail.

Each term is counted on its own (expected from the source's distinct identities, quarantined from the quarantine
table, upstream duplicates and superseded records from the source's key order, dropped from the late flags), so
a discrepancy planted in any one term shows as a gap, and the verdict turns ``unknown`` instead of ``ok``. The
discrepancy planted here is the one a reading bug would make: the same record read twice (same coordinates), or a
record classified two ways at once.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from streamproof.reconcile.checker import reconcile, reconcile_latest, reconcile_totals, reconcile_windows
from streamproof.reconcile.counts import Counts
from streamproof.reconcile.report import DAMAGED, OK, UNKNOWN, VERDICT_EXIT_CODES, Report, worst_verdict

COORDS = "_src_topic STRING, _src_partition INT, _src_offset LONG"
RECORDS = f"{COORDS}, event_id STRING, _valid BOOLEAN"


def _report(counts: Counts, unit: str = "records", **basis: str) -> Report:
    return Report(pipeline="p", guarantee="exactly-once", sink="s", unit=unit, basis=basis, **vars(counts))


def _quarantine(spark: Any, rows: list[tuple[str, int, int]]) -> Any:
    return spark.createDataFrame(rows, COORDS)


def _events(spark: Any, extra: list[tuple[str, int, int, str | None, bool]] = ()) -> Any:  # type: ignore[assignment]
    """e0..e3 valid at t:0@0..3, e1 resent at t:0@4 (an upstream duplicate), one invalid record at t:1@0."""
    rows = [("t", 0, i, f"e{i}", True) for i in range(4)] + [("t", 0, 4, "e1", True), ("t", 1, 0, None, False)]
    return spark.createDataFrame(rows + list(extra), RECORDS)


def test_the_identity_holds_on_an_honest_source_and_every_term_is_counted(spark: Any) -> None:
    sink = spark.createDataFrame([(f"e{i}",) for i in range(4)], "event_id STRING")
    counts = reconcile(_events(spark), sink, _quarantine(spark, [("t", 1, 0)]), key_columns=["event_id"])
    report = _report(counts)
    assert (counts.source_records, counts.expected, counts.quarantined, counts.upstream_duplicates) == (6, 4, 1, 1)
    assert (report.identity_gap, report.verdict, report.reasons) == (0, OK, [])


@pytest.mark.parametrize(
    ("term", "planted"),
    [
        ("expected", ("t", 0, 2, "e2", True)),  # a first record of its key read twice
        ("upstream_duplicates", ("t", 0, 4, "e1", True)),  # the resent record read twice
        ("quarantined", ("t", 1, 0, None, False)),  # the invalid record read twice
    ],
)
def test_a_record_read_twice_leaves_a_gap_in_the_records_identity(spark: Any, term: str, planted: tuple) -> None:
    sink = spark.createDataFrame([(f"e{i}",) for i in range(4)], "event_id STRING")
    counts = reconcile(_events(spark, [planted]), sink, _quarantine(spark, [("t", 1, 0)]), key_columns=["event_id"])
    report = _report(counts)
    assert (counts.source_records, counts.lost, counts.duplicated, counts.unexpected) == (7, 0, 0, 0)
    assert report.identity_gap == 1 and report.verdict == UNKNOWN and not report.ok, report.to_json()
    assert "+1 records unaccounted for" in report.reasons[0]
    assert not report.guarantee_held  # a count that does not add up is no proof of the guarantee


def test_a_record_both_dropped_and_expected_leaves_a_negative_gap(spark: Any) -> None:
    # e3 is flagged late-and-dropped and still valid: counted in expected and in dropped late.
    rows = [("t", 0, i, f"e{i}", True, i == 3) for i in range(4)]
    source = spark.createDataFrame(rows, f"{RECORDS}, _dropped BOOLEAN")
    sink = spark.createDataFrame([(f"e{i}",) for i in range(4)], "event_id STRING")
    counts = reconcile(source, sink, _quarantine(spark, []), key_columns=["event_id"])
    assert (counts.expected, counts.dropped_late) == (4, 1)
    assert _report(counts).identity_gap == -1 and _report(counts).verdict == UNKNOWN


def test_without_dedup_a_coordinate_read_twice_leaves_a_gap(spark: Any) -> None:
    source = spark.createDataFrame([("t", 0, i, f"e{i}", True) for i in (0, 1, 1)], RECORDS)
    sink = spark.createDataFrame([("t", 0, 0), ("t", 0, 1)], COORDS)
    report = _report(reconcile(source, sink, _quarantine(spark, [])))
    assert (report.source_records, report.expected, report.identity_gap) == (3, 2, 1)


LATEST = f"{COORDS}, order_id STRING, event_time STRING, _valid BOOLEAN"


def test_superseded_records_come_from_the_source_key_order(spark: Any) -> None:
    rows = [("t", 0, 0, "o1", "2026-01-01 00:00:01", True), ("t", 0, 1, "o1", "2026-01-01 00:00:03", True),
            ("t", 0, 2, "o2", "2026-01-01 00:00:02", True)]  # fmt: skip
    sink = spark.createDataFrame([("t", 0, 1, "o1"), ("t", 0, 2, "o2")], f"{COORDS}, order_id STRING")
    honest = reconcile_latest(spark.createDataFrame(rows, LATEST), sink, _quarantine(spark, []), "order_id",
                              "event_time")  # fmt: skip
    assert (honest.expected, honest.superseded, _report(honest, "keys").identity_gap) == (2, 1, 0)
    read_twice = spark.createDataFrame([*rows, rows[0]], LATEST)  # the superseded record read twice
    counts = reconcile_latest(read_twice, sink, _quarantine(spark, []), "order_id", "event_time")
    assert (counts.superseded, counts.lost, counts.duplicated, counts.unexpected) == (1, 0, 0, 0)
    assert _report(counts, "keys").identity_gap == 1 and _report(counts, "keys").verdict == UNKNOWN


def test_totals_fold_records_by_group_order_and_a_double_read_leaves_a_gap(spark: Any) -> None:
    schema = f"{COORDS}, customer_id STRING, amount DOUBLE, _valid BOOLEAN"
    rows = [("t", 0, 0, "c1", 1.0, True), ("t", 0, 1, "c1", 2.0, True), ("t", 0, 2, "c2", 4.0, True)]
    sink = spark.createDataFrame([("c1", Decimal(3), 2), ("c2", Decimal(4), 1)],
                                 "customer_id STRING, amount DECIMAL(38, 10), events LONG")  # fmt: skip
    honest = reconcile_totals(spark.createDataFrame(rows, schema), sink, _quarantine(spark, []), "customer_id",
                              ["amount"])  # fmt: skip
    assert (honest.expected, honest.superseded, _report(honest, "groups").verdict) == (2, 1, OK)
    doubled = reconcile_totals(spark.createDataFrame([*rows, rows[1]], schema), sink, _quarantine(spark, []),
                               "customer_id", ["amount"])  # fmt: skip
    assert _report(doubled, "groups").identity_gap == 1


def test_windows_count_upstream_duplicates_from_the_dedup_key_order(spark: Any) -> None:
    from pyspark.sql import functions as F

    from streamproof.config import parse_pipeline

    transform = parse_pipeline("""
name = "w"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING, amount DOUBLE, event_time TIMESTAMP"
required = ["event_time"]
dedup = { columns = ["event_id"], watermark = "event_time", delay = "1 minute" }
aggregate = { window = "1 minute", sum = ["amount"], watermark = "event_time", delay = "1 minute" }
[sink]
kind = "delta"
path = "/tmp/unused"
""").transform
    schema = f"{COORDS}, event_id STRING, amount DOUBLE, event_time STRING, _valid BOOLEAN"
    rows = [("t", 0, 0, "e0", 1.0, "2026-01-01 00:00:10", True), ("t", 0, 1, "e0", 1.0, "2026-01-01 00:00:10", True),
            ("t", 0, 2, "e1", 2.0, "2026-01-01 00:00:20", True)]  # fmt: skip

    def counts_of(records: list[tuple]) -> Counts:
        source = spark.createDataFrame(records, schema).withColumn("event_time", F.to_timestamp("event_time"))
        no_rows = spark.createDataFrame([], "window_start TIMESTAMP, window_end TIMESTAMP, sum_amount "
                                            "DECIMAL(38, 10), events LONG")  # fmt: skip
        return reconcile_windows(source, no_rows, _quarantine(spark, []), transform, closed_through_ms=0)

    honest = counts_of(rows)
    assert (honest.pending, honest.upstream_duplicates, _report(honest, "windows").identity_gap) == (2, 1, 0)
    assert _report(counts_of([*rows, rows[2]]), "windows").identity_gap == 1


def test_verdicts_reasons_and_exit_codes_without_a_jvm() -> None:
    clean = Counts(source_records=10, expected=9, quarantined=1, upstream_duplicates=0, sink_records=9, lost=0,
                   duplicated=0, unexpected=0)  # fmt: skip
    assert _report(clean).verdict == OK
    damaged = _report(Counts(**{**vars(clean), "duplicated": 1}))
    unknown = _report(Counts(**{**vars(clean), "expected": 8}))
    assert (damaged.verdict, unknown.verdict, unknown.identity_gap) == (DAMAGED, UNKNOWN, 1)
    assert worst_verdict([_report(clean), unknown]) == UNKNOWN and worst_verdict([unknown, damaged]) == DAMAGED
    assert [VERDICT_EXIT_CODES[v] for v in (OK, DAMAGED, UNKNOWN)] == [0, 1, 3]
    # A clean count on a trusted basis stays ok, and says what it trusted.
    trusted = _report(clean, quarantined="trusted: the quarantine table's late records", expected="recomputed")
    assert trusted.ok and trusted.reasons == ["quarantined trusted: the quarantine table's late records"]
    assert trusted.to_dict()["verdict"] == OK and trusted.to_dict()["basis"]["expected"] == "recomputed"


def test_records_not_yet_read_are_a_term_of_their_own_and_never_change_the_verdict() -> None:
    """A pipeline stopped after its first batch: 20,000 source records, 4,990 delivered, 10 quarantined, 15,000 past
    what the checkpoint and the sink committed. They are a term of the identity (counted from their coordinates, so a
    record read twice past the cut leaves a gap like anywhere else) and the verdict stays ok. Drained, the term is 0,
    left out of the identity as printed, and 0 in the JSON."""
    live = Counts(
        source_records=20_000,
        expected=4_990,
        quarantined=10,
        upstream_duplicates=0,
        sink_records=4_990,
        lost=0,
        duplicated=0,
        unexpected=0,
        not_yet_read=15_000,
    )
    report = _report(live)
    assert report.identity_terms == [
        ("expected", 4_990),
        ("quarantined", 10),
        ("upstream dups", 0),
        ("not yet read", 15_000),
    ]
    assert (report.identity_gap, report.verdict, report.reasons, report.guarantee_held) == (0, OK, [], True)
    assert report.to_dict()["not_yet_read"] == 15_000
    read_twice = _report(Counts(**{**vars(live), "source_records": 20_001}))
    assert (read_twice.identity_gap, read_twice.verdict) == (1, UNKNOWN)
    drained = _report(Counts(**{**vars(live), "expected": 19_990, "sink_records": 19_990, "not_yet_read": 0}))
    assert [name for name, _ in drained.identity_terms] == ["expected", "quarantined", "upstream dups"]
    assert drained.to_dict()["not_yet_read"] == 0 and "no_cut" not in drained.to_dict()
    # No cut (a files source): records not read yet count as lost, and the report says why.
    uncut = Report(
        **{
            **vars(_report(Counts(**{**vars(live), "not_yet_read": 0, "lost": 15_000}))),
            "no_cut": "a files source's positions are not offsets per partition",
        }
    )
    assert (
        uncut.reasons[-1]
        == "lost may include records not yet read (a files source's positions are not offsets per partition)"
    )


def test_the_spark_cut_sets_records_past_it_apart_and_a_double_read_there_leaves_a_gap(spark: Any) -> None:
    """Committed through t:0@2 and t:1@1, batch 1 planned through t:0@4: the sink holds t:0@2 past the cut (read),
    not t:0@3-5 (not yet read); the invalid t:1@1 past the cut is not in quarantine (not yet read). The term is
    counted from coordinates: t:0@5 read twice past the cut leaves a gap of 1. A sink of dedup keys is read through
    the last record it holds per partition (e1, below the cut and missing from it, is lost)."""
    from streamproof.reconcile.cut import sink_position, split_read
    from streamproof.reconcile.read_through import ReadThrough, with_unread

    cut = ReadThrough.of({"t": {"0": 2, "1": 1}}, {"t": {"0": 4, "1": 1}})
    rows = [("t", 0, i, f"e{i}", True) for i in range(6)] + [("t", 1, 0, None, False), ("t", 1, 1, None, False)]
    sink = spark.createDataFrame([("t", 0, i) for i in range(3)], COORDS)
    quarantine = _quarantine(spark, [("t", 1, 0)])

    def counted(records: list[tuple]) -> Counts:  # type: ignore[type-arg]
        read, unread = split_read(spark.createDataFrame(records, RECORDS), cut, quarantine, held=sink)
        return with_unread(reconcile(read, sink, quarantine), unread)

    counts = counted(rows)
    assert (counts.source_records, counts.expected, counts.quarantined, counts.not_yet_read) == (8, 3, 1, 4)
    assert (counts.lost, counts.unexpected, _report(counts).identity_gap, _report(counts).verdict) == (0, 0, 0, OK)
    assert _report(counted([*rows, ("t", 0, 5, "e5", True)])).identity_gap == 1

    keys = spark.createDataFrame([("t", 0, 0, "e0"), ("t", 0, 2, "e2")], f"{COORDS}, event_id STRING")
    at = sink_position(cut, keys)
    assert at == {("t", 0): 3, ("t", 1): 1}
    read, unread = split_read(spark.createDataFrame(rows, RECORDS), cut, quarantine, at=at)
    deduped = with_unread(reconcile(read, keys, quarantine, key_columns=["event_id"]), unread)
    assert (deduped.expected, deduped.lost, deduped.not_yet_read, _report(deduped).identity_gap) == (3, 1, 4, 0)
