"""The independent checker's judgement and its own record parsing, without a JVM: planted loss, duplicates,
unexpected rows, wrong sums and wrong late flags each give their exact count."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from conftest import LATE_TIMES, UNLOGGED_TIMES, late_checkpoint, unlogged_checkpoint
from streamproof.config import FilesSource
from streamproof.reconcile.counts import Counts
from streamproof.reconcile.independent import committed_parquet_files, flag_late, judge_sink, maybe_late_judged
from streamproof.reconcile.own_cut import read_through as own_read_through
from streamproof.reconcile.own_cut import sink_position, split_read, tried
from streamproof.reconcile.own_schema import RecordSchema
from streamproof.reconcile.pure import (
    SourceRecord,
    Windows,
    check_latest,
    check_records,
    check_totals,
    check_windows,
)
from streamproof.reconcile.read_through import ReadThrough, shown, with_unread
from streamproof.reconcile.report import DAMAGED, OK, UNKNOWN, Report
from streamproof.reconcile.stored import StoredFolder
from streamproof.storage.location import Location


def _records(valid: int, invalid: int) -> list[SourceRecord]:
    return [SourceRecord(("t", 0, i), True, values={"event_id": f"e{i}"}) for i in range(valid)] + [
        SourceRecord(("t", 1, i), False) for i in range(invalid)
    ]


def test_records_count_loss_duplicates_and_unexpected_rows_exactly() -> None:
    sink = [("t", 0, i) for i in range(10) if i not in (4, 5)]  # 2 lost
    sink += [("t", 0, 7), ("t", 0, 7), ("t", 0, 8), ("t", 0, 99), ("x", 0, 1)]  # 3 duplicated, 2 unexpected
    quarantine = [("t", 1, 0), ("t", 1, 1), ("t", 1, 1), ("t", 0, 3)]  # t:1@2 lost, t:1@1 doubled, t:0@3 valid
    counts = check_records(_records(10, 3), sink, quarantine)
    assert (counts.lost, counts.duplicated, counts.unexpected) == (2 + 1, 3 + 1, 2 + 1)
    assert (counts.expected, counts.quarantined, counts.quarantine_lost, counts.sink_records) == (10, 2, 1, 13)
    assert [(r["_src_offset"], r.get("in")) for r in counts.samples["lost"]] == [(2, "quarantine"), (4, None),
                                                                                (5, None)]  # fmt: skip


def test_dedup_keys_count_upstream_duplicates_from_key_order() -> None:
    source = _records(4, 0) + [SourceRecord(("t", 0, 9), True, values={"event_id": "e1"})]
    counts = check_records(source, [("e0",), ("e1",), ("e2",), ("e3",), ("e3",)], [], key_columns=["event_id"])
    assert (counts.expected, counts.upstream_duplicates, counts.duplicated) == (4, 1, 1)


def test_latest_state_loses_a_stale_key_and_counts_stray_rows() -> None:
    def event(offset: int, order: str, time: str | None) -> SourceRecord:
        stamp = datetime.fromisoformat(time).replace(tzinfo=UTC) if time else None
        return SourceRecord(("t", 0, offset), True, values={"order_id": order, "event_time": stamp})

    source = [event(0, "o1", "2026-01-01 00:00:01"), event(1, "o1", "2026-01-01 00:00:03"),
              event(2, "o2", "2026-01-01 00:00:05"), event(3, "o3", None),
              event(4, "o3", "2026-01-01 00:00:04")]  # fmt: skip
    clean = check_latest(source, [("o1", ("t", 0, 1)), ("o2", ("t", 0, 2)), ("o3", ("t", 0, 4))], [], "order_id",
                         "event_time")  # fmt: skip
    assert (clean.expected, clean.superseded, clean.lost, clean.duplicated, clean.unexpected) == (3, 2, 0, 0, 0)
    stale = [("o1", ("t", 0, 0)), ("o2", ("t", 0, 2)), ("o2", ("t", 0, 2)), ("o3", ("t", 9, 9)), ("o9", ("t", 0, 1))]
    counts = check_latest(source, stale, [], "order_id", "event_time")
    assert (counts.lost, counts.duplicated, counts.unexpected) == (2, 1, 2)


def test_totals_catch_a_double_increment_a_wrong_sum_and_a_missing_group() -> None:
    events = [("c1", 0.1), ("c1", 0.2), ("c2", 5.0), ("c3", 1.25), ("c4", 2.0)]
    source = [SourceRecord(("t", 0, i), True, values={"c": c, "amount": a}) for i, (c, a) in enumerate(events)]
    clean = [("c1", 2, {"amount": Decimal("0.3")}), ("c2", 1, {"amount": 5}), ("c3", 1, {"amount": Decimal("1.25")}),
             ("c4", 1, {"amount": 2})]  # fmt: skip
    assert check_totals(source, clean, [], "c", ["amount"]).duplicated == 0
    damaged = [("c1", 3, {"amount": Decimal("0.5")}), ("c2", 1, {"amount": 5}), ("c3", 1, {"amount": 9.99}),
               ("c9", 1, {"amount": 1})]  # fmt: skip
    counts = check_totals(source, damaged, [], "c", ["amount"])
    assert (counts.lost, counts.duplicated, counts.unexpected, counts.superseded) == (1, 2, 1, 1)
    # c1's doubled increment is a duplicate; c3's right count with the wrong sum a wrong value (of duplicated).
    assert counts.wrong_values == 1 and [r["c"] for r in counts.samples["duplicated"]] == ["c1"]
    assert [(r["c"], r["held_amount"]) for r in counts.samples["wrong_values"]] == [("c3", "9.9900000000")]


def test_a_null_total_is_a_wrong_value_and_an_all_null_group_holding_0_is_clean() -> None:
    """The reported run: batches of two, c1 null then 3.0, c2 5.0 then 1.0 (and c3 only null). The old sink held
    c1 as NULL (``NULL + 3.0``); the expected total is 3.0 (a null amount counts as 0), so the NULL is a wrong value,
    named with both values, and no guarantee allows it. The all-null group must hold 0: a NULL there is wrong too."""
    from streamproof.reconcile.report import DAMAGED, OK, Report

    events = [("c1", None), ("c2", 5.0), ("c1", 3.0), ("c2", 1.0), ("c3", None)]
    source = [SourceRecord(("t", 0, i), True, values={"c": c, "amount": a}) for i, (c, a) in enumerate(events)]

    def report(counts: Any, guarantee: str = "exactly-once") -> Report:
        return Report(pipeline="p", guarantee=guarantee, sink="s", unit="groups", **vars(counts))

    right = [("c1", 2, {"amount": Decimal("3.0")}), ("c2", 2, {"amount": Decimal("6")}), ("c3", 1, {"amount": 0})]
    clean = check_totals(source, right, [], "c", ["amount"])
    assert (clean.lost, clean.duplicated, clean.wrong_values, clean.unexpected, clean.samples) == (0, 0, 0, 0, {})
    assert report(clean).verdict == OK

    poisoned = [("c1", 2, {"amount": None}), *right[1:]]
    counts = check_totals(source, poisoned, [], "c", ["amount"])
    assert (counts.lost, counts.duplicated, counts.wrong_values, counts.unexpected) == (0, 1, 1, 0)
    assert counts.samples == {"wrong_values": [{"c": "c1", "expected_events": 2, "held_events": 2,
                                                "expected_amount": "3.0000000000", "held_amount": None}]}  # fmt: skip
    assert report(counts).verdict == DAMAGED
    assert not report(counts, "at-least-once").guarantee_held  # not a duplicate at-least-once may show
    null_for_nothing = check_totals(source, [*right[:2], ("c3", 1, {"amount": None})], [], "c", ["amount"])
    assert (null_for_nothing.wrong_values, null_for_nothing.samples["wrong_values"][0]["held_amount"]) == (1, None)


def test_windows_compare_every_value_and_leave_open_windows_pending() -> None:
    def at(offset: int, group: str, amount: float, time: str) -> SourceRecord:
        when = datetime.fromisoformat(f"2026-01-01 {time}").replace(tzinfo=UTC)
        return SourceRecord(("t", 0, offset), True, values={"g": group, "amount": amount, "event_time": when})

    source = [at(0, "a", 1.25, "00:00:10"), at(1, "a", 2.5, "00:00:50"), at(2, "a", 4.0, "00:01:30"),
              at(3, "a", 8.0, "00:02:30"), at(4, "b", 16.0, "00:00:20")]  # fmt: skip

    def row(start: str, group: str, total: str, events: int) -> dict[str, object]:
        begin = datetime.fromisoformat(f"2026-01-01 {start}:00").replace(tzinfo=UTC)
        return {"window_start": begin, "window_end": begin.replace(minute=begin.minute + 1), "g": group,
                "sum_amount": Decimal(total), "events": events}  # fmt: skip

    sink = [row("00:00", "a", "3.75", 2), row("00:01", "a", "4.5", 1), row("00:00", "b", "16", 1),
            row("00:00", "b", "16", 1), row("00:02", "a", "8", 1)]  # fmt: skip
    windows = Windows("event_time", 60_000_000, ("g",), ("amount",), True)
    counts = check_windows(source, sink, [], windows, closed_through_ms=1767225720000)  # 00:02
    assert (counts.expected, counts.lost, counts.duplicated, counts.unexpected) == (3, 0, 2, 1)
    assert (counts.aggregated, counts.pending, counts.sink_records) == (4, 1, 5)


def test_late_flags_come_from_the_offset_log_and_a_wrong_flag_shows(tmp_path: Path) -> None:
    """Batches 0-2 read offsets 0-2, 3-5, 6-7; batch 1 logged the watermark 00:10. Only batch 2 judges by it, so
    only offset 6 (00:10, at the watermark) is late; the quarantine holding another record as late is unexpected."""
    spec = late_checkpoint(tmp_path)
    times = LATE_TIMES
    source = [SourceRecord(("t", 0, i), True, values={"event_id": f"e{i}",
                                                      "event_time": datetime.fromisoformat(f"2026-01-01 {t}+00:00")})
              for i, t in enumerate(times)]  # fmt: skip
    assert flag_late(spec, source, []) == "recomputed"
    assert [record.at[2] for record in source if not record.valid] == [6]
    sink = [(f"e{i}",) for i in range(9) if i != 6]
    assert check_records(source, sink, [("t", 0, 6)], key_columns=["event_id"]).unexpected == 0
    wrong = check_records(source, sink, [("t", 0, 6), ("t", 0, 7)], key_columns=["event_id"])  # 7 is not late
    assert (wrong.unexpected, wrong.lost) == (1, 0)


def _unlogged_source() -> list[SourceRecord]:
    return [SourceRecord(("t", 0, i), True, values={"event_id": f"e{i}",
                                                    "event_time": datetime.fromisoformat(f"2026-01-01 {t}+00:00")})
            for i, t in enumerate(UNLOGGED_TIMES)]  # fmt: skip


def test_dropped_late_records_of_batches_the_offset_log_no_longer_holds_are_unknown_never_lost(tmp_path: Path) -> None:
    """dedup.late = "drop", the offset log starts at batch 3 (Spark keeps the last 100 entries): the reported run's
    "594 lost" were the records the pipeline dropped as told. The logged batches are recomputed (6 and 9 late, so
    dropped); of batches 0-3's records, those older than batch 3's watermark (1, 2, 4) may have been dropped: the sink
    holds 2 and 4 (delivered), not 1, which is dropped or lost, nothing can tell. Expected: 0 lost, 3 dropped late,
    and the verdict unknown with that reason; with 1 held too, ok; a logged record missing is still damage."""
    from deltalake import write_deltalake

    from streamproof.reconcile.report import DAMAGED, OK, UNKNOWN, Report

    spec = unlogged_checkpoint(tmp_path, late="drop")
    source = _unlogged_source()
    basis = flag_late(spec, source, [])
    assert [r.at[2] for r in source if r.dropped] == [6, 9] and [r.at[2] for r in source if r.maybe_late] == [1, 2, 4]
    assert basis.startswith("unknown: 3 records of batches 0-3 older than batch 3's watermark")  # if the sink lacks all

    def report(delivered: list[int]) -> Report:
        write_deltalake(str(tmp_path / "sink"), pa.table({"event_id": [f"e{i}" for i in delivered]}), mode="overwrite")
        judged, basis, unverifiable = maybe_late_judged(spec, spec.sink_specs[0], source, {"expected": "recomputed"},
                                                        "")  # fmt: skip
        counts = check_records(judged, [(f"e{i}",) for i in delivered], [], key_columns=["event_id"])
        return Report(pipeline="p", guarantee="exactly-once", sink="s", basis=basis, unverifiable=unverifiable,
                      **vars(counts))  # fmt: skip

    unknown = report([0, 2, 3, 4, 5, 7, 8, 10, 11])
    assert (unknown.lost, unknown.duplicated, unknown.unexpected, unknown.dropped_late) == (0, 0, 0, 3)
    assert (unknown.expected, unknown.source_records, unknown.identity_gap, unknown.verdict) == (9, 12, 0, UNKNOWN)
    assert unknown.unchecked["dropped_late"].startswith("1 records of batches 0-3 older than batch 3's watermark "
                                                        "are not in the sink: dropped as late or lost")  # fmt: skip
    assert "dropped_late not checked: 1 records" in " | ".join(unknown.reasons)
    all_held = report([0, 1, 2, 3, 4, 5, 7, 8, 10, 11])
    assert (all_held.expected, all_held.dropped_late, all_held.verdict) == (10, 2, OK)
    assert all_held.trusted["dropped_late"].startswith("the sink holds the 3 records of batches 0-3")
    one_lost = report([0, 2, 3, 4, 5, 8, 10, 11])  # 7: a logged batch's record, recomputed as not late
    assert (one_lost.lost, one_lost.verdict) == (1, DAMAGED)


def test_with_late_quarantined_only_the_unlogged_batches_trust_the_quarantine_table(tmp_path: Path) -> None:
    """dedup.late = "quarantine", the offset log from batch 3: the quarantine table says which of batches 0-3's older
    records were late (1); the logged batches are recomputed, so its listing 7 (not late) is unexpected, not trusted."""
    spec = unlogged_checkpoint(tmp_path, late="quarantine")
    source = _unlogged_source()
    listed = [("t", 0, offset, "late") for offset in (1, 6, 7, 9)]
    basis = flag_late(spec, source, listed)
    sink = [(f"e{i}",) for i in (0, 2, 3, 4, 5, 7, 8, 10, 11)]
    counts = check_records(source, sink, [row[:3] for row in listed], key_columns=["event_id"])
    assert (counts.expected, counts.quarantined, counts.lost, counts.unexpected) == (9, 3, 0, 1)
    assert [r.at[2] for r in source if not r.valid] == [1, 6, 9] and not any(r.dropped for r in source)
    assert basis.startswith("trusted: which of the 3 records of batches 0-3 older than batch 3's watermark were late")


def test_the_own_schema_reads_every_kind_of_bad_record_the_generator_makes() -> None:
    schema = RecordSchema.parse("event_id STRING, order_id STRING, amount DOUBLE, qty INT, event_time TIMESTAMP, "
                                "price DECIMAL(10, 2)", required=["event_id", "order_id"])  # fmt: skip
    good = b'{"event_id":"e1","order_id":"o1","amount":12.5,"qty":3,"event_time":"2026-01-01T00:00:00.123Z"}'
    values, reason = schema.read(good)
    assert reason is None and values["event_time"] == datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)
    bad = {b"": "empty", None: "empty", b"\xff\xfe\x00": "not_utf8", b'{"event_id":"e1","order_': "invalid_json",
           b"[1, 2]": "invalid_json", b'{"event_id":"e1","amount":"twelve euros","order_id":"o"}': "schema",
           b'{"event_id":"e1","order_id":"o","event_time":"yesterday"}': "schema",
           b'{"event_id":"e1","order_id":"o","qty":1.5}': "schema",
           b'{"event_id":"e1","order_id":"o","amount":1e400}': "out_of_range:amount",
           b'{"event_id":"","order_id":"o"}': "missing_required:event_id",
           b'{"event_id":"e1"}': "missing_required:order_id"}  # fmt: skip
    assert {value: schema.read(value)[1] for value in bad} == bad


def test_only_the_files_the_sink_log_committed_are_read(tmp_path: Path) -> None:
    log = tmp_path / "_spark_metadata"
    log.mkdir()

    def entry(name: str, action: str = "add") -> str:
        return json.dumps({"path": (tmp_path / name).as_uri(), "action": action})

    (log / "0").write_text(f"v1\n{entry('a.parquet')}")
    (log / "1.compact").write_text(f"v1\n{entry('a.parquet')}\n{entry('b.parquet')}")
    (log / "2").write_text(f"v1\n{entry('c.parquet')}\n{entry('a.parquet', 'delete')}")
    assert [Path(path).name for path in committed_parquet_files(StoredFolder.at(Location(tmp_path), "files"))] == [
        "b.parquet",
        "c.parquet",
    ]


def test_a_folder_without_the_sink_log_is_read_as_spark_lists_it(tmp_path: Path) -> None:
    for name in ("part-0.parquet", "sub/part-1.parquet", "_temporary/part-2.parquet", ".part-3.parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    listed = committed_parquet_files(StoredFolder.at(Location(tmp_path), "files"))
    assert [Path(p).relative_to(tmp_path).as_posix() for p in listed] == [
        "part-0.parquet",
        "sub/part-1.parquet",
    ]


# ------------------------------------------------------------------------------ a pipeline not read to its end


def _counts_past(
    cut: ReadThrough,
    source: list[SourceRecord],
    sink: list[Any],
    quarantine: list[Any],
    key_columns: list[str] | None = None,
    **position: Any,
) -> Report:
    """The independent checker's records judgement over the records the cut says were read, as a report."""
    read, unread = split_read(source, cut, quarantine, **position)
    counts = with_unread(check_records(read, sink, quarantine, key_columns), unread)
    return Report(pipeline="p", guarantee="exactly-once", sink="s", read_through=cut.to_json(), **vars(counts))


def test_a_record_past_the_committed_batch_is_delivered_when_held_and_not_yet_read_when_not() -> None:
    """Committed through t:0@4 and t:1@2, batch 1 planned through t:0@8 and t:1@5, the sink a batch ahead in part:
    t:0@4-5 held (delivered, not unexpected), t:0@6-9 and t:1@2 not held (not yet read, not lost); of the invalid
    records past the cut, t:1@3 is in quarantine (read), t:1@4 not (not yet read). A record below the cut missing
    from the sink is lost, as ever."""
    cut = ReadThrough.of({"t": {"0": 4, "1": 2}}, {"t": {"0": 8, "1": 5}})
    source = [SourceRecord(("t", 0, i), True) for i in range(10)] + [
        SourceRecord(("t", 1, i), i in (1, 2)) for i in range(5)
    ]
    sink = [("t", 0, i) for i in range(6)] + [("t", 1, 1)]
    quarantine = [("t", 1, 0), ("t", 1, 3)]
    report = _counts_past(cut, source, sink, quarantine, held=sink)
    figures = (report.source_records, report.expected, report.quarantined, report.not_yet_read, report.sink_records)
    assert figures == (15, 7, 2, 6, 7), report.to_json()
    assert (report.lost, report.duplicated, report.unexpected, report.identity_gap, report.verdict) == (0, 0, 0, 0, OK)
    assert report.identity_terms[-1] == ("not yet read", 6)
    assert report.to_dict()["read_through"] == {
        "t": {"0": {"committed": 4, "planned": 8}, "1": {"committed": 2, "planned": 5}}
    }
    assert "no_cut" not in report.to_dict()

    below = _counts_past(cut, source, [row for row in sink if row != ("t", 0, 1)], quarantine, held=sink)
    assert (below.lost, below.not_yet_read, below.verdict) == (1, 6, DAMAGED)
    assert below.samples["lost"] == [{"_src_topic": "t", "_src_partition": 0, "_src_offset": 1}]
    drained = ReadThrough.of({"t": {"0": 10, "1": 5}}, {"t": {"0": 10, "1": 5}})  # the cut at the topic's end
    assert _counts_past(drained, source, sink, quarantine, held=sink).to_dict() == {
        **check_report(source, sink, quarantine).to_dict(),
        "read_through": drained.to_json(),
    }


def check_report(source: list[SourceRecord], sink: list[Any], quarantine: list[Any]) -> Report:
    """The report as it was before the cut: every record judged to the source's end."""
    return Report(pipeline="p", guarantee="exactly-once", sink="s", **vars(check_records(source, sink, quarantine)))


def test_a_resend_past_the_cut_makes_no_read_record_an_upstream_duplicate() -> None:
    """Dedup on event_id across two partitions: e1 first at t:1@0 (read), resent at t:0@1, past partition 0's
    committed bound and past the last record the sink holds there: not yet read. It is no upstream duplicate, and
    it does not make the read e1 one (by coordinates it would come first); drained, it is the upstream duplicate."""
    source = [
        SourceRecord(("t", 0, 0), True, values={"event_id": "e0"}),
        SourceRecord(("t", 0, 1), True, values={"event_id": "e1"}),
        SourceRecord(("t", 1, 0), True, values={"event_id": "e1"}),
    ]
    sink = [("e0", "t", 0, 0), ("e1", "t", 1, 0)]  # each key's first record, with its coordinates
    cut = ReadThrough.of({"t": {"0": 1, "1": 1}}, {"t": {"0": 2, "1": 1}})
    at = sink_position(cut, [row[1:] for row in sink])
    report = _counts_past(cut, source, [row[:1] for row in sink], [], at=at, key_columns=["event_id"])
    figures = (report.expected, report.upstream_duplicates, report.not_yet_read, report.identity_gap, report.verdict)
    assert figures == (2, 0, 1, 0, OK), report.to_json()
    drained = check_records(source, [row[:1] for row in sink], [], key_columns=["event_id"])
    assert (drained.expected, drained.upstream_duplicates, drained.not_yet_read) == (2, 1, 0)
    # The sink holds e1's resend as its first record: partition 0 was read through it, the other e1 is the duplicate.
    ahead = sink_position(cut, [("t", 0, 0), ("t", 0, 1)])
    assert ahead == {("t", 0): 2, ("t", 1): 1}


def _kafka_pipeline(workdir: Path, guarantee: str = "exactly-once", sink: str = "") -> Any:
    from streamproof.config import parse_pipeline

    return parse_pipeline(f'''
name = "cut"
guarantee = "{guarantee}"
checkpoint = "{workdir / "cp"}"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING, amount DOUBLE"
quarantine = "{workdir / "quarantine"}"
[sink]
kind = "delta"
path = "{workdir / "sink"}"
{sink}''')


def _log(checkpoint: Path, batch_id: int, ends: dict[str, dict[str, int]], committed: bool) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    metadata = json.dumps({"batchWatermarkMs": 1000 * batch_id, "batchTimestampMs": 0, "conf": {}})
    (checkpoint / "offsets" / str(batch_id)).write_text(f"v1\n{metadata}\n{json.dumps(ends)}")
    if committed:
        (checkpoint / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_both_checkers_read_the_same_bounds_from_the_checkpoint(tmp_path: Path) -> None:
    """C from the last committed batch, P from the last logged one; a partition an entry does not name is at 0. Both
    readers (the pipeline's checkpoint module for the Spark checker, the independent checker's own text reading)
    agree; a files source gets no cut."""
    from streamproof.reconcile import cut as spark_cut

    spec = _kafka_pipeline(tmp_path)
    assert own_read_through(spec) == spark_cut.read_through(spec) == ReadThrough()  # nothing logged yet
    _log(tmp_path / "cp", 0, {"t": {"0": 5}}, committed=True)
    _log(tmp_path / "cp", 1, {"t": {"0": 9, "1": 4}}, committed=False)
    cut = own_read_through(spec)
    assert cut == spark_cut.read_through(spec)
    assert (cut.committed_at("t", 1), cut.planned_at("t", 1), cut.planned_watermark_ms, cut.logged) == (
        0,
        4,
        1000,
        True,
    )
    assert cut.candidates() == [{("t", 0): 5}, {("t", 0): 9, ("t", 1): 4}]
    files = spec.model_copy(update={"source": FilesSource(kind="files", path=str(tmp_path / "in"))})
    assert own_read_through(files).no_cut.startswith("a files source's positions are not offsets")


def test_at_most_once_reads_both_bounds_from_its_progress_file(tmp_path: Path) -> None:
    """At-most-once marks a batch done in its progress file before writing it, and each start wipes Spark's logs:
    its cut is the progress file's, whatever Spark's logs of the current run say. A record below it missing from the
    sink is lost (at-most-once may lose it), one past it is not yet read."""
    from streamproof.checkpoint.folder import ProgressFile
    from streamproof.reconcile import cut as spark_cut

    spec = _kafka_pipeline(tmp_path, guarantee="at-most-once")
    _log(tmp_path / "cp", 0, {"t": {"0": 2}}, committed=True)  # the current run's batch 0, from the progress on
    ProgressFile(spec.checkpoint_dir).mark_done({"t": {"0": 6}}, batch_id=3)
    cut = own_read_through(spec)
    assert cut == spark_cut.read_through(spec) and cut.to_json() == {"t": {"0": {"committed": 6, "planned": 6}}}
    source = [SourceRecord(("t", 0, i), True) for i in range(9)]
    sink = [("t", 0, i) for i in range(6) if i != 4]  # batch 3 (offsets 4-5) marked done, killed mid-write
    report = Report(**{**vars(_counts_past(cut, source, sink, [], held=sink)), "guarantee": "at-most-once"})
    assert (report.lost, report.not_yet_read, report.identity_gap, report.guarantee_held) == (1, 3, 0, True)


def test_an_empty_checkpoint_reads_nothing_and_with_sink_rows_is_unknown(tmp_path: Path) -> None:
    """No batch in the checkpoint: with nothing in the sink or the quarantine, every record is not yet read (ok);
    with rows in the sink, what was read cannot be told: no cut, the verdict unknown, saying why."""
    from deltalake import write_deltalake

    spec = _kafka_pipeline(tmp_path)
    source = [SourceRecord(("t", 0, i), True) for i in range(4)]
    counts, _, _, why = judge_sink(spec, spec.sink_specs[0], source, [], {}, own_read_through(spec))
    assert (counts.not_yet_read, counts.lost, why) == (4, 0, "")
    coordinates = {
        "_src_topic": ["t", "t"],
        "_src_partition": pa.array([0, 0], pa.int32()),
        "_src_offset": pa.array([0, 1], pa.int64()),
    }
    write_deltalake(str(tmp_path / "sink"), pa.table(coordinates))
    counts, _, cut, why = judge_sink(spec, spec.sink_specs[0], source, [], {}, own_read_through(spec))
    report = Report(pipeline="p", guarantee="exactly-once", sink="s", unverifiable=why, **vars(counts), **shown(cut))
    assert (report.lost, report.not_yet_read, report.verdict) == (2, 0, UNKNOWN), report.to_json()
    assert report.reasons[0].startswith("the checkpoint has no batch while the sink holds rows")
    assert report.to_dict()["no_cut"] == report.unverifiable


def test_totals_are_taken_at_the_planned_batch_when_they_reconcile_there_else_at_the_committed_one() -> None:
    """A sink of running totals names no record: it is taken at the committed bounds, at the planned ones, or at the
    source's end, whichever it reconciles at first; when none, at the committed ones (and the damage shows)."""
    source = [SourceRecord(("t", 0, i), True, values={"c": "c1", "amount": 1.0}) for i in range(6)]
    cut = ReadThrough.of({"t": {"0": 2}}, {"t": {"0": 4}})

    def judged(held: list[Any]) -> Counts:
        return tried(source, cut, [], lambda read, _: check_totals(read, held, [], "c", ["amount"]))

    at_planned = judged([("c1", 4, {"amount": Decimal(4)})])  # the sink wrote batch 1, its commit not yet logged
    assert (at_planned.expected, at_planned.superseded, at_planned.not_yet_read, at_planned.duplicated) == (1, 3, 2, 0)
    at_committed = judged([("c1", 2, {"amount": Decimal(2)})])
    assert (at_committed.superseded, at_committed.not_yet_read, at_committed.lost) == (1, 4, 0)
    neither = judged([("c1", 3, {"amount": Decimal(3)})])  # half a batch: judged at the committed bounds
    assert (neither.duplicated, neither.not_yet_read) == (1, 4)
    restored = judged([("c1", 6, {"amount": Decimal(6)})])  # the sink ahead of an older checkpoint, restored
    assert (restored.duplicated, restored.not_yet_read, restored.superseded) == (0, 0, 5)
