"""The replay rule and the batches a restored checkpoint passes by, without a JVM: the decision on what a sink holds
(`sinks/base.py`), and `held_beyond` on a Parquet folder's own log and commit records (read as files).

Cases of the rule: a held batch with the checkpoint's offsets is skipped; with other offsets, or another start, it is
refused; a batch below the sink's newest that it never held is refused; below what a sink can still vouch for (Kafka's
compacted markers) it is refused; a new batch, or one held only in part, is written. Cases of the rule for a share of a
batch held in part (`share_decision`): a share without a record is written; one whose record is this batch's, with the
replay's source ranges or none, is skipped, with other ranges refused; one whose record is a later batch's (its own
compacted away) is skipped when its rows lie below that batch's, and refused otherwise. Cases of `held_beyond`: the
batches every sink holds whose quarantine records are done (held, or none) are passed by without running; one that
had records for the quarantine table that it does not hold stops that; a batch no sink records is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import plant_delta_commit
from streamproof.checkpoint.log import rebuild
from streamproof.checkpoint.positions import held_beyond
from streamproof.checkpoint.start import starting_point
from streamproof.config import parse_pipeline
from streamproof.errors import PipelineError
from streamproof.sinks import open_sinks
from streamproof.sinks.base import (
    TOO_OLD_REPAIR,
    Batch,
    HeldBatches,
    ShareRecord,
    SinkCommit,
    replay_decision,
    share_decision,
)
from streamproof.sinks.files import BATCHES_DIR, METADATA_DIR
from streamproof.sinks.kafka import KafkaSink
from streamproof.storage.location import Location


def _ends(end: int) -> dict[str, dict[str, int]]:
    return {"t": {"0": end}}


def _held(*batches: int, complete: bool = True) -> HeldBatches:
    return HeldBatches({batch: SinkCommit(batch, _ends(batch * 10), True, complete) for batch in batches})


def _batch(batch_id: int, end: int | None = None, start: int | None = None) -> Batch:
    start_offsets = _ends(start if start is not None else (batch_id - 1) * 10) if batch_id else None
    return Batch("p", batch_id, _ends(end if end is not None else batch_id * 10), True, start_offsets=start_offsets)


def test_the_rule_skips_what_the_sink_holds_writes_what_it_does_not_and_refuses_what_differs() -> None:
    held = _held(4, 5, 6)
    assert replay_decision(held, _batch(5), "sink") and replay_decision(held, _batch(6), "sink")  # two replays
    assert not replay_decision(held, _batch(7), "sink")  # new
    assert not replay_decision(_held(4, 5, complete=False), _batch(5), "sink")  # in part: its shares decide
    with pytest.raises(PipelineError, match=r"^sink holds batch 6 of pipeline 'p' with end offsets .* nothing was"):
        replay_decision(held, _batch(6, end=65), "sink")
    with pytest.raises(PipelineError, match=r"^sink holds batch 4 of pipeline 'p' ending at .* starts batch 5 at"):
        replay_decision(held, _batch(5, start=45), "sink")
    with pytest.raises(PipelineError, match=r"^sink holds batches of pipeline 'p' up to 6 but not batch 3"):
        replay_decision(_held(2, 4, 5, 6), _batch(3), "sink")
    compacted = HeldBatches(_held(5, 6).commits, known_from=5)
    with pytest.raises(PipelineError, match=r"^sink no longer records the batches of pipeline 'p' before batch 5"):
        replay_decision(compacted, _batch(3), "sink")
    unkeyed = _held(1)
    unkeyed.add(SinkCommit(2, _ends(20), keyed=False))
    assert unkeyed.through == 1 and 2 not in unkeyed.commits


SHARE = {"t/0": [40, 59, 20]}  # a share of batch 4: offsets 40-59 of source partition t/0, 20 records


def test_a_share_without_a_record_is_written_and_one_recorded_with_its_rows_or_none_is_skipped() -> None:
    assert share_decision(None, 4, "t/0@40", SHARE, "sink") is False
    assert share_decision(ShareRecord(4, {"t/0": [40, 59, 20]}), 4, "t/0@40", SHARE, "sink") is True
    assert share_decision(ShareRecord(4, None), 4, "t/0@40", SHARE, "sink") is True  # a record that does not say


def test_a_share_recorded_with_other_rows_is_refused_naming_both() -> None:
    for recorded in ({"t/0": [40, 49, 10]}, {"t/0": [40, 59, 20], "t/1": [0, 9, 10]}, {}):
        with pytest.raises(PipelineError) as refused:
            share_decision(ShareRecord(4, recorded), 4, "t/0@40", SHARE, "sink")
        assert str(refused.value) == (
            f"sink: batch 4's share t/0@40 was committed with source ranges {json.dumps(recorded)} but the replay "
            'holds {"t/0": [40, 59, 20]}: the checkpoint does not belong to this sink, the transform changed since '
            "the batch was written, or the batch is split otherwise (`min_partitions` changed since)"
        )


def test_a_share_whose_record_is_compacted_away_is_held_by_a_later_batch_of_its_partition_above_its_rows() -> None:
    assert share_decision(ShareRecord(5, {"t/0": [60, 79, 20]}), 4, "t/0@40", SHARE, "markers") is True
    not_below = [{"t/0": [59, 79, 21]}, {"t/0": [50, 79, 30]}, {"t/1": [60, 79, 20]}, {}, None]
    for later in not_below:
        with pytest.raises(PipelineError) as refused:
            share_decision(ShareRecord(5, later), 4, "t/0@40", SHARE, "markers")
        assert str(refused.value) == (
            'markers: the marker of batch 4 t/0@40 is compacted away, and the replay holds {"t/0": [40, 59, 20]}, '
            f"not below batch 5's {json.dumps(later or {})} of the same source partition: the checkpoint does not "
            "belong to this topic"
        )


def test_a_compacted_marker_topic_vouches_only_for_its_unbroken_newest_batches() -> None:
    spec = parse_pipeline('name = "p"\n[source]\nkind = "kafka"\ntopic = "t"\n[transform]\nschema = "event_id STRING"\n'
                          '[sink]\nkind = "kafka"\ntopic = "out"')  # fmt: skip
    sink = open_sinks(spec)[0]
    assert isinstance(sink, KafkaSink)
    sink._marked = [0, 1, 2, 3]
    assert sink.known_from({}) is None  # every batch from the first marked: nothing compacted away
    sink._marked = [1, 5, 7, 8, 9]
    assert sink.known_from({}) == 7


def _folder_pipeline(tmp_path: Path, held: dict[int, int | None], committed_through: int) -> object:
    """A Parquet folder holding ``held`` (batch -> its quarantined count in the commit record, None: no record), a
    checkpoint committed through ``committed_through``, the same offsets everywhere."""
    spec = parse_pipeline(f"""
name = "p"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING"
quarantine = "{tmp_path}/quarantine"
[sink]
kind = "files"
path = "{tmp_path}/files"
""")
    (tmp_path / "files" / METADATA_DIR).mkdir(parents=True)
    (tmp_path / "files" / BATCHES_DIR).mkdir()
    for batch_id, quarantined in held.items():
        (tmp_path / "files" / METADATA_DIR / str(batch_id)).write_text("v1\n")
        if quarantined is not None:
            record = {"pipeline": "p", "batch_id": batch_id, "end_offsets": _ends(batch_id * 10),
                      "quarantined": quarantined}  # fmt: skip
            (tmp_path / "files" / BATCHES_DIR / f"{batch_id}.json").write_text(json.dumps(record))
    rebuild(Location(tmp_path / "checkpoint"), {b: _ends(b * 10) for b in range(committed_through + 1)},
            committed_through=committed_through)  # fmt: skip
    return spec


def test_a_replay_older_than_the_offsets_a_parquet_folder_keeps_is_refused_naming_the_way_back() -> None:
    """A checkpoint backup restored more than 100 batches behind a Parquet folder (found by `prove --nemesis`: a
    backup of batch 22 restored at batch 192): the folder still lists the batch in its log, but its offsets record is
    gone. The refusal says why and names the repairs, which the nemesis applies (putting back the checkpoint the
    restore replaced)."""
    held = HeldBatches({23: SinkCommit(23, None, True), 24: SinkCommit(24, _ends(240), True)})
    with pytest.raises(PipelineError) as refusal:
        replay_decision(held, _batch(23, end=230), "/data/orders")
    message = str(refusal.value)
    assert message.startswith("/data/orders holds batch 23 of pipeline 'p' without the source offsets it was written "
                              "with (a Parquet folder keeps them for its newest 100 batches only") and (
        message.endswith(TOO_OLD_REPAIR)) and "\n" not in message, message  # fmt: skip


def test_a_restored_checkpoint_passes_by_the_batches_every_sink_holds_with_nothing_left_for_quarantine(
    tmp_path: Path,
) -> None:
    spec = _folder_pipeline(tmp_path, {0: 0, 1: 0, 2: 0, 3: 0, 4: 2, 5: 0}, committed_through=1)
    beyond = held_beyond(spec, open_sinks(spec), starting_point(spec))  # type: ignore[arg-type]
    assert list(beyond.offsets) == [2, 3, 4, 5] and beyond.offsets[4] == _ends(40)
    # Batch 4 had 2 records for the quarantine table, which does not hold it: from there on the batches run.
    assert beyond.everywhere == (2, 3)


def test_a_batch_beyond_the_checkpoint_that_no_sink_records_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = _folder_pipeline(tmp_path, {0: 0, 1: 0, 2: 0, 3: None, 4: 0}, committed_through=1)
    with pytest.raises(PipelineError) as refusal:
        held_beyond(spec, open_sinks(spec), starting_point(spec))  # type: ignore[arg-type]
    message = str(refusal.value)
    # The folder lists batch 3 in its log, but its offsets record is gone (a backup restored more than 100 batches
    # behind it, found by `prove --nemesis`): refused naming why, and the ways back the nemesis knows.
    assert message.startswith("the sinks of pipeline 'p' hold batch(es) [3] beyond the checkpoint's last committed "
                              "batch 1 without the source offsets they were written with (a Parquet folder keeps "
                              "them for its newest 100 batches only") and message.endswith(TOO_OLD_REPAIR) and (
        "\n" not in message), message  # fmt: skip


def test_a_batch_no_sink_holds_ends_where_the_batch_after_it_recorded_its_start(tmp_path: Path) -> None:
    """Found by `prove --nemesis` on S3: a Delta sink lost the commit of batch 22, the quarantine table never held 22
    (it had no invalid records) but holds 23. Batch 22's end offsets were nowhere, and neither repair the refusal named
    could go on. Each commit now records where its batch started: 22 ends where 23 started, and is replayed."""
    spec = _folder_pipeline(tmp_path, {0: 0, 1: 0, 2: 0, 4: 0}, committed_through=1)
    record = json.loads((tmp_path / "files" / BATCHES_DIR / "4.json").read_text())
    (tmp_path / "files" / BATCHES_DIR / "4.json").write_text(json.dumps({**record, "start_offsets": _ends(30)}))
    beyond = held_beyond(spec, open_sinks(spec), starting_point(spec))  # type: ignore[arg-type]
    assert beyond.offsets == {2: _ends(20), 3: _ends(30), 4: _ends(40)}
    (tmp_path / "files" / BATCHES_DIR / "4.json").write_text(json.dumps(record))  # a record of before: refused
    with pytest.raises(PipelineError, match=r"hold batch\(es\) \[3\] beyond the checkpoint's last committed batch 1"):
        held_beyond(spec, open_sinks(spec), starting_point(spec))  # type: ignore[arg-type]


def test_a_batch_beyond_the_checkpoint_no_sink_holds_nor_dates_is_refused_naming_both_ways_back(tmp_path: Path) -> None:
    """A Delta sink holds batches 2 and 4 beyond the checkpoint's last committed batch 1, not 3 (storage lost that
    commit), and batch 4's record is of before streamproof recorded where a batch starts: batch 3's offsets are
    nowhere. The start refuses in one line naming the backup to restore and the rebuild, never a replay of a guess."""
    spec = parse_pipeline(f"""
name = "p"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING"
quarantine = "{tmp_path}/quarantine"
[sink]
kind = "delta"
path = "{tmp_path}/orders"
""")
    log = tmp_path / "orders" / "_delta_log"
    log.mkdir(parents=True)
    for version, batch_id in enumerate((0, 1, 2, 4)):
        plant_delta_commit(log, version, pipeline="p", batch_id=batch_id, end_offsets=_ends(batch_id * 10))
    rebuild(Location(tmp_path / "checkpoint"), {b: _ends(b * 10) for b in range(2)}, committed_through=1)
    with pytest.raises(PipelineError) as refusal:
        held_beyond(spec, open_sinks(spec), starting_point(spec))
    message = str(refusal.value)
    assert message == (
        "the sinks of pipeline 'p' hold batches [2, 4] beyond the checkpoint's last committed batch 1 but none holds "
        "batch(es) [3], whose offsets are then unknown: restore the checkpoint backup the sinks were written with, or "
        "rebuild it from their records (move it aside, then `streamproof checkpoint recover <pipeline>`)"
    ), message


def test_batches_every_sink_holds_are_marked_done_on_one_listing_of_each_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backup restored far back: the batches every sink holds of a stateless pipeline are logged with the offsets
    the sinks recorded and marked done without running. Each listed the two logs six times (a LIST each on S3); now
    both logs are listed once for all of them. A batch Spark logged already with those offsets
    keeps its entry; one it logged with another range stops the passing-by there, and runs as Spark planned it."""
    from streamproof.checkpoint.log import batch_end_offsets, commit_without_running, next_batch_to_run

    checkpoint = Location(tmp_path / "checkpoint")
    rebuild(checkpoint, {0: _ends(0), 1: _ends(10)}, committed_through=0)  # batch 1 in flight, as Spark planned it
    listings = []
    real_names = Location.names

    def names(folder: Location) -> list[str]:
        listings.append(folder.name)
        return real_names(folder)

    monkeypatch.setattr(Location, "names", names)
    held = {batch_id: _ends(batch_id * 10) for batch_id in range(1, 201)}
    assert commit_without_running(checkpoint, held, list(held)) == list(held)
    assert sorted(listings) == ["commits", "offsets"], listings
    assert next_batch_to_run(checkpoint) == 201 and batch_end_offsets(checkpoint, 200) == _ends(2000)

    rebuild(Location(tmp_path / "other"), {0: _ends(0), 1: _ends(15)}, committed_through=0)  # planned otherwise
    assert commit_without_running(Location(tmp_path / "other"), {1: _ends(10), 2: _ends(20)}, [1, 2]) == []
    assert next_batch_to_run(Location(tmp_path / "other")) == 1
