"""The proof matrix's decisions, without Spark: which cells fail the matrix (every cell must be as expected, the
weaker guarantees' too: a cell that shows none of its damage is a blind harness) and the exit code of
``prove --matrix`` (cells constructed as a run would give them); in a fan-out, which faults each sink's row is
credited with (a kill inside one sink's write is that sink's alone) and the damage each row must show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import streamproof.harness.cluster as harness_cluster
import streamproof.harness.matrix as harness_matrix
import streamproof.jvm.session as jvm_session
from streamproof.cli import app
from streamproof.config import load_pipeline, parse_pipeline
from streamproof.faults.points import AFTER_CHECKPOINT_COMMIT, AFTER_SINK_COMMIT, BEFORE_SINK_WRITE, MID_SINK_WRITE
from streamproof.guarantees import GUARANTEES
from streamproof.harness.cells import (
    MatrixCell,
    cells_not_as_expected,
    credited,
    damage_to,
    guarantee_given,
    worst_damage,
    your_expected_damage,
)
from streamproof.harness.crashes import Crash, HarnessResult, runs_of
from streamproof.harness.matrix import _cells, batches_of_cell, moment_cells

REPO = Path(__file__).resolve().parent.parent


def cell(guarantee: str, point: str, expected: str, **given: Any) -> MatrixCell:
    base: dict[str, Any] = {"sink": "delta", "lost": 0, "duplicated": 0, "unexpected": 0, "restart_s": 1.0,
                            "seconds": 1.0, "crashes": [{"point": point, "batch_id": 1, "facts": {}}]}  # fmt: skip
    return MatrixCell(guarantee=guarantee, point=point, expected=expected, **{**base, **given})


AS_EXPECTED = [
    cell("exactly-once", "after-sink-commit", "clean"),
    cell("at-least-once", "after-sink-commit", "duplicated", duplicated=120),
    cell("at-most-once", "before-sink-write", "lost", lost=90),
]


def test_a_matrix_whose_every_cell_is_as_expected_passes() -> None:
    assert cells_not_as_expected(AS_EXPECTED) == []


@pytest.mark.parametrize(
    ("failing", "why"),
    [
        (
            cell("at-least-once", "after-sink-commit", "duplicated"),
            "at-least-once x after-sink-commit [delta]: expected duplicated, showed clean: lost 0, duplicated 0, "
            "unexpected 0 (a fault that left no damage: a blind harness?)",
        ),
        (
            cell("at-most-once", "before-sink-write", "lost"),
            "at-most-once x before-sink-write [delta]: expected lost, showed clean: lost 0, duplicated 0, unexpected 0 "
            "(a fault that left no damage: a blind harness?)",
        ),
        (
            cell(
                "at-most-once",
                "before-sink-write",
                "lost",
                lost=90,
                missed=["before-sink-write: the offset log does not hold the batch"],
            ),
            "at-most-once x before-sink-write [delta]: its fault left no evidence (before-sink-write: the offset log "
            "does not hold the batch)",
        ),
        (
            cell("at-least-once", "after-sink-commit", "duplicated", lost=3, duplicated=120),
            "at-least-once x after-sink-commit [delta]: expected duplicated, showed lost+duplicated: lost 3, "
            "duplicated 120, unexpected 0",
        ),
        (
            cell("at-least-once", "after-sink-commit", "duplicated", duplicated=120, identity_gap=7),
            "at-least-once x after-sink-commit [delta]: 7 records the reconciliation could not account for",
        ),
        (
            cell("exactly-once", "mid-sink-write", "clean", duplicated=5),
            "exactly-once x mid-sink-write [delta]: expected clean, showed duplicated: lost 0, duplicated 5, "
            "unexpected 0",
        ),
    ],
)
def test_every_cell_not_as_expected_fails_the_matrix_with_which_and_why(failing: MatrixCell, why: str) -> None:
    assert cells_not_as_expected([*AS_EXPECTED, failing]) == [why]


@pytest.mark.parametrize(
    ("weaker", "code"),
    [
        (cell("at-least-once", "after-sink-commit", "duplicated", duplicated=120), 0),
        (cell("at-least-once", "after-sink-commit", "duplicated"), 1),  # shows none of its damage
        (
            cell(
                "at-most-once",
                "mid-sink-write",
                "lost",
                lost=60,
                missed=["mid-sink-write: the write of delta had not started"],
            ),
            1,
        ),  # its fault missed
    ],
)
def test_prove_matrix_exits_1_when_a_weaker_guarantees_cell_is_not_as_expected(
    weaker: MatrixCell, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cells a run would give; Spark is neither started nor needed for the decision.
    cells = [cell("exactly-once", "after-sink-commit", "clean"), weaker]
    # Where the command finds them when it runs (it imports the rooms it calls then).
    monkeypatch.setattr(jvm_session, "local_session", lambda *args, **kwargs: None)
    monkeypatch.setattr(harness_matrix, "run_matrix", lambda *args, **kwargs: cells)
    monkeypatch.setattr(harness_cluster, "cluster_faults", lambda state: None)
    result = CliRunner().invoke(app, ["prove", str(REPO / "examples" / "orders_to_delta.toml"), "--matrix",
                                      "--state-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == code, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("matrix failed")]
    if code:
        assert failed == [f"matrix failed: 1 of 2 cells not as expected: {cells_not_as_expected(cells)[0]}"]
    else:
        assert failed == []


# A fan-out: its sinks written one after the other in this order in every batch.
FAN_OUT = parse_pipeline("""
name = "fan"
source = { kind = "kafka", topic = "t" }
transform = { schema = "id STRING" }
sinks = [{ label = "delta", kind = "delta", path = "/t/delta" }, { label = "files", kind = "files", path = "/t/files" },
         { label = "copy", kind = "delta", path = "/t/copy" }]
""")
LABELS = ["delta", "files", "copy"]


def test_a_fan_outs_mid_sink_write_cell_kills_each_sink_in_turn_a_run_each() -> None:
    cells = {(guarantee, point): armed for guarantee, point, armed in _cells(FAN_OUT, GUARANTEES, None, None)}
    for guarantee in GUARANTEES:
        assert cells[(guarantee, MID_SINK_WRITE)] == [f"{MID_SINK_WRITE}:{label}" for label in LABELS]
        for point in (BEFORE_SINK_WRITE, AFTER_SINK_COMMIT, AFTER_CHECKPOINT_COMMIT):  # every sink at once
            assert cells[(guarantee, point)] == [point]
    assert runs_of(cells[("at-least-once", MID_SINK_WRITE)]) == [[f"{MID_SINK_WRITE}:{label}"] for label in LABELS]
    # Enough batches for a run per sink: at-most-once replays nothing, so each of its runs takes two fresh batches.
    assert [batches_of_cell(guarantee, len(LABELS)) for guarantee in GUARANTEES] == [5, 5, 7]
    # A point that names its sink stays as given; one sink needs no label.
    assert _cells(FAN_OUT, ["exactly-once"], ["mid-sink-write:files"], None) == [
        ("exactly-once", "mid-sink-write:files", ["mid-sink-write:files"])
    ]
    one_sink = FAN_OUT.model_copy(update={"sinks": FAN_OUT.sinks[:1]})
    assert _cells(one_sink, ["exactly-once"], [MID_SINK_WRITE], None) == [
        ("exactly-once", MID_SINK_WRITE, [MID_SINK_WRITE])
    ]


def crash(where: str, batch_id: int, run: int) -> Crash:
    return Crash(where, batch_id, 10.0, run, restarted_in_s=float(run), facts={"write_started": [where]})


def test_each_sinks_row_carries_only_the_faults_that_hit_it() -> None:
    result = HarnessResult(
        crashes=[crash(f"{MID_SINK_WRITE}:{label}", run, run) for run, label in enumerate(LABELS, start=1)],
        missed=["mid-sink-write: the write of files had not started; log: run-2.log"],
        missed_at=[f"{MID_SINK_WRITE}:files"],
    )
    for label in LABELS:
        crashes, missed = credited(result, label, LABELS)
        assert [c.point for c in crashes] == [f"{MID_SINK_WRITE}:{label}"]
        assert missed == (result.missed if label == "files" else [])
    # Points that are not inside one sink's write hit every sink of the batch; an unnamed write point, the first.
    every = HarnessResult(crashes=[crash(AFTER_SINK_COMMIT, 1, 1), crash(BEFORE_SINK_WRITE, 2, 2),
                                   crash(MID_SINK_WRITE, 3, 3)])  # fmt: skip
    assert [len(credited(every, label, LABELS)[0]) for label in LABELS] == [3, 2, 2]


@pytest.mark.parametrize(
    ("guarantee", "expected"),
    [
        # delta is written before files' and copy's killed writes: they replay it; copy's own write never began
        # when delta's or files' was killed.
        ("at-least-once", {"delta": "duplicated", "files": "duplicated", "copy": "clean"}),
        ("at-most-once", {"delta": "lost", "files": "lost", "copy": "lost"}),
        ("exactly-once", {"delta": "clean", "files": "clean", "copy": "clean"}),
    ],
)
def test_each_sinks_row_expects_the_damage_every_crash_of_its_cell_left_in_it(
    guarantee: str, expected: dict[str, str]
) -> None:
    armed = [f"{MID_SINK_WRITE}:{label}" for label in LABELS]
    got = {label: worst_damage(damage_to(label, where, LABELS, guarantee, has_invalid_records=False) for where in armed)
           for label in LABELS}  # fmt: skip
    assert got == expected


def test_your_sinks_exactly_once_cell_with_damage_fails_the_matrix_saying_which_guarantee_it_gave() -> None:
    """Your own sink under exactly-once is handed every batch, replays included: a duplicate there is your code's, and
    the cell fails (it used to be "as expected" whatever it showed). Under at-least-once a duplicate may be your code
    absorbing a replay or not; rows no record explains are never as expected."""
    expected = your_expected_damage("exactly-once", "clean", "mid-sink-write")
    doubled = cell("exactly-once", "mid-sink-write#1", expected, sink="ledger", duplicated=989)
    assert cells_not_as_expected([doubled]) == [
        "exactly-once x mid-sink-write#1 [ledger]: expected clean, showed duplicated: lost 0, duplicated 989, "
        "unexpected 0"
    ]
    assert guarantee_given([doubled], "ledger").startswith("ledger (your sink) gave at-least-once: duplicated 989")
    weaker = your_expected_damage("at-least-once", "duplicated", "after-sink-commit")
    assert weaker == "may-duplicate"
    absorbed_or_not = cell("at-least-once", "after-sink-commit", weaker, sink="ledger", duplicated=5)
    assert cells_not_as_expected([absorbed_or_not]) == []
    stray = cell("at-least-once", "after-sink-commit", weaker, sink="ledger", duplicated=5, unexpected=3)
    assert cells_not_as_expected([stray]) == [
        "at-least-once x after-sink-commit [ledger]: 3 rows no source record explains (lost 0, duplicated 5): no "
        "guarantee allows them"
    ]


def test_the_matrix_arms_the_first_moment_of_your_sinks_and_a_cell_for_each_further_one() -> None:
    spec = load_pipeline(REPO / "examples" / "your_code" / "foreach_batch.toml")
    cells = _cells(spec, ["exactly-once"], ["mid-sink-write"], None)
    labels = ["control-table-ledger", "merge-upsert", "jdbc-upsert", "epoch-ledger-writer"]
    assert cells == [("exactly-once", "mid-sink-write", [f"mid-sink-write:{label}#1" for label in labels])]
    learned = {"control-table-ledger": ["save data", "save control"], "merge-upsert": ["merge"],
               "jdbc-upsert": ["commit"], "epoch-ledger-writer": ["task commit 1", "task commit 2"]}  # fmt: skip
    assert moment_cells("exactly-once", cells[0][2], labels, learned) == [
        ("exactly-once", "mid-sink-write#2", [f"mid-sink-write:{label}#2" for label in (labels[0], labels[3])])
    ]
