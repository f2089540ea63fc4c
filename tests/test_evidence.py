"""A crash proves something only with evidence that it happened where it was armed (no JVM: facts as the harness
records them right after a SIGKILL, for a clean kill and for each way a blind harness could miss)."""

from __future__ import annotations

from typing import Any

import pytest

from streamproof.harness.cells import MatrixCell
from streamproof.harness.evidence import crash_happened, evidence_text
from streamproof.render import matrix_table

LOGGED = {"offsets_logged": True, "checkpoint_committed": False}


def facts(**given: Any) -> dict[str, Any]:
    return {**LOGGED, "sink_has_batch": False, "sink_txn": False, "write_started": [], **given}


@pytest.mark.parametrize(
    ("point", "on_disk"),
    [
        ("before-sink-write", facts()),
        ("mid-sink-write", facts(write_started=["delta"])),
        ("after-sink-commit", facts(write_started=["delta"], sink_has_batch=True, sink_txn=True)),
        ("after-checkpoint-commit", facts(write_started=["delta"], sink_has_batch=True, checkpoint_committed=True)),
    ],
)
def test_the_facts_of_each_point_are_its_evidence(point: str, on_disk: dict[str, Any]) -> None:
    assert crash_happened(point, on_disk, "delta") is None


@pytest.mark.parametrize(
    ("point", "on_disk", "why"),
    [
        ("before-sink-write", facts(offsets_logged=False), "the offset log does not hold the batch"),
        ("before-sink-write", facts(write_started=["delta"]), "the write of delta had already started"),
        ("mid-sink-write", facts(), "the write of delta had not started"),
        ("mid-sink-write", facts(write_started=["delta"], sink_has_batch=True), "already holds the whole batch"),
        ("mid-sink-write", facts(write_started=["delta"], checkpoint_committed=True), "commit log already holds"),
        ("after-sink-commit", facts(write_started=["delta"]), "not every sink holds the batch"),
        ("after-checkpoint-commit", facts(sink_has_batch=True), "commit log does not hold the batch"),
    ],
)
def test_a_kill_that_landed_elsewhere_is_a_missed_fault(point: str, on_disk: dict[str, Any], why: str) -> None:
    missing = crash_happened(point, on_disk, "delta")
    assert missing is not None and missing.startswith(f"{point}: ") and why in missing


def test_a_fan_out_kill_mid_write_is_judged_in_the_armed_sink() -> None:
    # Killed in pg's write: the sink before it (delta) holds the batch; pg committed some partitions only.
    partial = facts(write_started=["delta", "pg"], held_by=["delta", "pg"], partial_in=["pg"], sink_txn=True)
    assert crash_happened("mid-sink-write", partial, "pg") is None
    whole = facts(write_started=["delta", "pg"], held_by=["delta", "pg"], sink_txn=True)
    assert "pg already holds the whole batch" in str(crash_happened("mid-sink-write", whole, "pg"))
    assert crash_happened("mid-sink-write", partial, "kafka") == "mid-sink-write: the write of kafka had not started"


def test_sinks_that_keep_no_log_of_their_batches_give_no_evidence_and_are_not_asked_for_it() -> None:
    # at-least-once: PostgreSQL append and the Parquet folder write unkeyed, with no ledger or sink log.
    after = facts(write_started=["delta", "pg", "files"], held_by=["delta"], unlogged=["pg", "files"])
    assert crash_happened("after-sink-commit", after, "delta") is None
    done = {**after, "checkpoint_committed": True}
    assert crash_happened("after-checkpoint-commit", done, "delta") is None  # found missed by a matrix run
    too_early = facts(write_started=["delta", "pg"], held_by=[], unlogged=["pg"])
    assert "before delta committed" in str(crash_happened("after-sink-commit", too_early, "delta"))


def test_every_matrix_cell_shows_its_evidence_and_a_missed_fault_fails_it() -> None:
    def cell(**given: Any) -> MatrixCell:
        base: dict[str, Any] = {"guarantee": "at-least-once", "sink": "pg", "point": "mid-sink-write", "lost": 0,
                                "duplicated": 0, "unexpected": 0, "restart_s": 1.0, "expected": "may-duplicate",
                                "seconds": 1.0, "crashes": [{"facts": facts(write_started=["pg"])}]}  # fmt: skip
        return MatrixCell(**{**base, **given})

    clean = cell()
    assert (clean.outcome, clean.as_expected) == ("clean", True)
    assert clean.evidence == "offsets logged; write started: pg; no sink holds the batch; not in the commit log"
    missed = cell(missed=["mid-sink-write: the write of pg had not started"])
    assert (missed.outcome, missed.as_expected) == ("missed", False)
    unaccounted = cell(identity_gap=1)
    assert (unaccounted.outcome, unaccounted.as_expected) == ("unknown", False)
    rows = matrix_table([clean, cell(duplicated=3)]).columns
    outcomes = list(rows[7].cells)
    assert "(of may-duplicate)" in str(outcomes[0]) and "(of may-duplicate)" in str(outcomes[1])
    assert list(rows[8].cells)[0] == clean.evidence


def test_the_evidence_of_a_fault_of_the_machines_is_its_task_attempts() -> None:
    attempts = {"attempts": 5, "ends": {"Success": 4, "ExecutorLostFailure": 1}, "speculative": 0}
    assert evidence_text(attempts) == "5 write task attempts (1 ExecutorLostFailure, 4 Success)"
