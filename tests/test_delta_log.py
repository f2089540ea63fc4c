"""What streamproof reads of a Delta log costs the same on a table of months as on a new one.

A log of 1,500 commits of the pipeline is planted as files (Delta's own layout: commit, checksum, a checkpoint
every 100 versions and the ``_last_checkpoint`` pointer). Expected: the latest version, the pipeline's newest
commit and the check for files past the last commit read a handful of files and list nothing; a log whose newest
commits storage lost is still answered right (listed, the one case that needs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import streamproof.sinks.delta_log as delta_log
from conftest import plant_delta_commit
from streamproof.sinks.delta_log import commit_file, latest_version, log_past_its_commits, newest_commit
from streamproof.storage.location import Location

AGE = 1_500


def _plant(folder: Path, versions: range, *, pipeline: str = "aged", every: int = 100) -> Location:
    """Commits of ``pipeline`` (batch id = version) at ``versions``, each with its checksum, and a checkpoint every
    ``every`` versions with the pointer at the newest."""
    log = folder / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    for version in versions:
        plant_delta_commit(log, version, pipeline=pipeline, batch_id=version, end_offsets={"t": {"0": version}})
        (log / f"{version:020d}.crc").write_text("{}")
        if version and version % every == 0:
            (log / f"{version:020d}.checkpoint.parquet").write_bytes(b"PAR1")
            (log / "_last_checkpoint").write_text(json.dumps({"version": version, "size": 1}))
    return Location(folder)


class _Counted:
    """Counts the listings of a log and the commit files read while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listings, self.read = 0, 0
        real_names, real_commit = Location.names, delta_log.pipeline_commit

        def names(location: Location) -> list[str]:
            self.listings += 1
            return real_names(location)

        def commit(text: str, pipeline: str) -> object:
            self.read += 1
            return real_commit(text, pipeline)

        monkeypatch.setattr(Location, "names", names)
        monkeypatch.setattr(delta_log, "pipeline_commit", commit)


def test_an_old_table_s_latest_version_newest_commit_and_soundness_are_read_without_listing_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _plant(tmp_path / "aged", range(AGE))
    counted = _Counted(monkeypatch)
    assert latest_version(table) == AGE - 1  # from the pointer (version 1,400), forward
    assert latest_version(table, known=AGE - 1) == AGE - 1
    assert latest_version(table, known=3) == AGE - 1  # a stale start: forward all the same
    newest = newest_commit(table, "aged")
    assert newest is not None and newest.batch_id == AGE - 1 and newest.end_offsets == {"t": {"0": AGE - 1}}
    assert log_past_its_commits(table) is None
    assert counted.listings == 0 and counted.read == 1

    # Another writer's commits after the pipeline's newest (OPTIMIZE): read past, the older ones never.
    for version in range(AGE, AGE + 3):
        commit_file(table, version).write_text(json.dumps({"commitInfo": {"operation": "OPTIMIZE"}}))
    newest = newest_commit(table, "aged")
    assert newest is not None and newest.batch_id == AGE - 1 and counted.read == 1 + 4
    assert newest_commit(table, "another") is None  # ran back through every commit there is: none of it
    assert counted.listings == 0


def test_a_young_table_without_a_delta_checkpoint_is_listed_and_no_table_is_version_minus_one(tmp_path: Path) -> None:
    assert latest_version(_plant(tmp_path / "young", range(7))) == 6
    assert latest_version(Location(tmp_path / "none")) == -1
    assert newest_commit(Location(tmp_path / "none"), "aged") is None
    assert log_past_its_commits(Location(tmp_path / "none")) is None


@pytest.mark.parametrize("lost", [3, 150], ids=["after-the-pointer", "past-the-pointer"])
def test_an_old_table_whose_newest_commits_storage_lost_is_answered_as_a_listing_would(
    tmp_path: Path, lost: int
) -> None:
    """The trailing ``lost`` commit files and their checksums are deleted (the nemesis's lost-commit step); with 150
    lost, the checkpoint of version 1,400 and its pointer stay past the last commit."""
    table = _plant(tmp_path / "aged", range(AGE))
    log = tmp_path / "aged" / "_delta_log"
    for version in range(AGE - lost, AGE):
        (log / f"{version:020d}.json").unlink()
        (log / f"{version:020d}.crc").unlink()
    last = AGE - lost - 1
    assert latest_version(table) == last
    assert latest_version(table, known=AGE - 1) == last  # the version seen before is gone: the pointer, or a listing
    newest = newest_commit(table, "aged")
    assert newest is not None and newest.batch_id == last
    past = log_past_its_commits(table)
    if lost == 3:
        assert past is None  # nothing of the lost versions stayed
    else:
        assert past is not None and past.last_commit == last and past.needs == ()
        assert set(past.stranded) == {f"{1_400:020d}.checkpoint.parquet", "_last_checkpoint"}


def test_a_lost_commit_whose_checksum_stayed_is_found_past_the_last_commit(tmp_path: Path) -> None:
    table = _plant(tmp_path / "aged", range(AGE))
    (tmp_path / "aged" / "_delta_log" / f"{AGE - 1:020d}.json").unlink()
    past = log_past_its_commits(table)
    assert past is not None and past.last_commit == AGE - 2 and past.stranded == (f"{AGE - 1:020d}.crc",)


@pytest.mark.parametrize("left", [f".{AGE - 1:020d}.json.crc", f"{1_500:020d}.checkpoint.parquet"],
                         ids=["hidden-checksum", "checkpoint-at-the-next-interval"])  # fmt: skip
def test_the_start_s_quick_check_finds_each_trace_a_lost_commit_leaves_and_rewind_lists_the_whole_log(
    tmp_path: Path, left: str
) -> None:
    """The newest commit and Delta's checksum of it are lost; what stayed: Hadoop's hidden checksum of the commit, or
    a checkpoint Delta wrote at the next multiple of the table's interval with the pointer still at the previous one.
    A checkpoint planted at a version no usual interval reaches is found by the whole listing only (rewind's)."""
    table = _plant(tmp_path / "aged", range(AGE))
    log = tmp_path / "aged" / "_delta_log"
    for name in (f"{AGE - 1:020d}.json", f"{AGE - 1:020d}.crc"):
        (log / name).unlink()
    (log / left).write_text("planted")
    past = log_past_its_commits(table)
    assert past is not None and past.last_commit == AGE - 2 and left in past.stranded

    (log / left).unlink()
    (log / f"{AGE + 6:020d}.checkpoint.parquet").write_bytes(b"PAR1")
    assert log_past_its_commits(table) is None  # no trace the start looks for
    thorough = log_past_its_commits(table, thorough=True)
    assert thorough is not None and thorough.stranded == (f"{AGE + 6:020d}.checkpoint.parquet",)


def test_a_torn_checkpoint_pointer_is_listed_past_not_a_crash(tmp_path: Path) -> None:
    table = _plant(tmp_path / "aged", range(250))
    (tmp_path / "aged" / "_delta_log" / "_last_checkpoint").write_text('{"versi')
    assert latest_version(table) == 249  # listed
    assert log_past_its_commits(table) is None and log_past_its_commits(table, thorough=True) is None


def test_a_restore_is_read_past_whatever_the_number_of_commits_after_it(tmp_path: Path) -> None:
    """The pipeline's batches 0-2, 1,000 commits of another writer, then a RESTORE to version 1: its newest commit in
    effect is batch 1, read newest first without a JVM, past the other writer's commits in two walks (the first
    bounded by OTHERS_READ_PAST; the second must resume where the RESTORE sent the first, not inside what it undid)."""
    from streamproof.config import parse_pipeline
    from streamproof.sinks.delta import OTHERS_READ_PAST, DeltaSink

    table = _plant(tmp_path / "t", range(3))
    others = range(3, 3 + OTHERS_READ_PAST)
    for version in others:
        commit_file(table, version).write_text(json.dumps({"commitInfo": {"operation": "WRITE"}}))
    restore = {"commitInfo": {"operation": "RESTORE", "operationParameters": {"version": "1"}}}
    commit_file(table, others[-1] + 1).write_text(json.dumps(restore))
    spec = parse_pipeline(f"""
name = "aged"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING"
[sink]
kind = "delta"
path = "{table}"
""")
    sink = DeltaSink(spec, spec.sink_specs[0])
    assert sink.last_commit(None).batch_id == 1  # type: ignore[union-attr]
    assert sink.why_behind() == f"a RESTORE committed as version {others[-1] + 1} brought it back to version 1, " \
                                f"undoing versions 2-{others[-1]}"  # fmt: skip
    assert [commit.batch_id for commit in sink.commits()] == [0, 1]
