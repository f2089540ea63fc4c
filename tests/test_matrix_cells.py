"""The proof matrix's decisions, without Spark: which cells fail the matrix (every cell must be as expected, the
weaker guarantees' too: a cell that shows none of its damage is a blind harness) and the exit code of
``prove --matrix`` (cells constructed as a run would give them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import streamproof.cli.pipeline as cli_pipeline
from streamproof.cli import app
from streamproof.harness.matrix import MatrixCell, cells_not_as_expected

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
    monkeypatch.setattr(cli_pipeline, "local_session", lambda *args, **kwargs: None)
    monkeypatch.setattr(cli_pipeline, "run_matrix", lambda *args, **kwargs: cells)
    monkeypatch.setattr(cli_pipeline, "cluster_faults", lambda state: None)
    result = CliRunner().invoke(app, ["prove", str(REPO / "examples" / "orders_to_delta.toml"), "--matrix",
                                      "--state-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == code, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("matrix failed")]
    if code:
        assert failed == [f"matrix failed: 1 of 2 cells not as expected: {cells_not_as_expected(cells)[0]}"]
    else:
        assert failed == []
