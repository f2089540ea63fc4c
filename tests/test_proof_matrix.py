"""The proof matrix, CI-sized: Delta append; at-least-once where a crash duplicates (after-sink-commit) in CI, and
exactly-once where the crash finds the write begun (mid-sink-write) in the slow tier (the 25-minute CI budget: in CI
a MERGE, a Kafka and a Parquet write are killed mid-write by test_sinks_exactly_once.py, which also VACUUMs the files
its killed MERGE left). ``prove --matrix`` runs all 12. Elsewhere in CI: exactly-once after the sink commit on every
sink (test_sinks_exactly_once.py); before the write and after the checkpoint commit nothing is in flight, and
``prove --matrix`` proves them. 8,000 events per cell (0.5% malformed), each cell on a fresh topic, table and
checkpoint, one SIGKILL of the pipeline's process group in batch 1, restart until drained, record-by-record
reconciliation. A cell is run when a test first asks for it.

Expected: exactly-once 0/0; at-least-once duplicates after-sink-commit and never loses. A cell
that should show damage and shows none fails the test: a blind harness is a bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import write_pipeline
from streamproof.faults.points import AFTER_SINK_COMMIT, MID_SINK_WRITE
from streamproof.harness.cells import MatrixCell
from streamproof.harness.matrix import run_matrix
from streamproof.infra import KafkaBroker
from streamproof.render import matrix_html

# 2 cells of two JVM runs each: longer than the suite-wide timeout of one test on a loaded 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.timeout(1800)]

POINTS = (MID_SINK_WRITE,)
WEAKER_CELLS = {("at-least-once", AFTER_SINK_COMMIT)}  # where it shows its damage
CELLS = {("exactly-once", p) for p in POINTS} | WEAKER_CELLS


@pytest.fixture(scope="module")
def matrix_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix")


class Matrix:
    """The CI-sized matrix's cells, each run the first time a test asks for it (a test of the slow tier's cell does
    not make CI run it)."""

    def __init__(self, pipeline_file: Path, spark: Any, workdir: Path) -> None:
        self.pipeline_file, self.spark, self.workdir = pipeline_file, spark, workdir
        self.cells: dict[tuple[str, str], MatrixCell] = {}

    def __getitem__(self, key: tuple[str, str]) -> MatrixCell:
        if key not in self.cells:
            guarantee, point = key
            (cell,) = run_matrix(self.pipeline_file, self.spark, workdir=self.workdir, guarantees=(guarantee,),
                                 points=(point,), count=8_000, malformed=0.005, seed=7)  # fmt: skip
            self.cells[key] = cell
        return self.cells[key]


@pytest.fixture(scope="module")
def matrix(kafka_broker: KafkaBroker, spark: Any, matrix_workdir: Path) -> Matrix:
    pipeline_file = write_pipeline(
        matrix_workdir / "base", name="matrix", topic="matrix", bootstrap=kafka_broker.bootstrap_servers,
        max_offsets=4_000,
    )  # fmt: skip
    return Matrix(pipeline_file, spark, matrix_workdir)


WEAKER = ("at-least-once", AFTER_SINK_COMMIT)


def test_matrix_has_every_cell(matrix: Matrix) -> None:
    cells = {key: matrix[key] for key in sorted(CELLS)}
    assert all(len(cell.crashes) == 1 and cell.crashes[0]["batch_id"] == 1 for cell in cells.values())


@pytest.mark.parametrize("point", POINTS)
def test_exactly_once_is_clean(matrix: Matrix, point: str) -> None:
    cell = matrix[("exactly-once", point)]
    assert (cell.lost, cell.duplicated, cell.unexpected) == (0, 0, 0), cell.to_dict()


def test_at_least_once_duplicates_after_sink_commit_and_never_loses(matrix: Matrix) -> None:
    cell = matrix[WEAKER]
    assert cell.duplicated > 0 and (cell.lost, cell.unexpected) == (0, 0), cell.to_dict()


def test_every_cell_shows_exactly_the_damage_its_guarantee_predicts(matrix: Matrix) -> None:
    cells = {key: matrix[key] for key in sorted(CELLS)}
    surprises = {key: (cell.outcome, cell.expected) for key, cell in cells.items() if not cell.as_expected}
    assert surprises == {}


def test_after_sink_commit_kill_lands_between_sink_and_commit_log(matrix: Matrix) -> None:
    facts = matrix[WEAKER].crashes[0]["facts"]
    assert facts["sink_has_batch"] is True  # the sink transaction was durable...
    assert facts["checkpoint_committed"] is False  # ...and Spark's commits/<batch> was not written
    assert facts["sink_txn"] is False  # only exactly-once keys the write on the batch


def test_kill_mid_write_leaves_nothing_in_the_sink(matrix: Matrix) -> None:
    facts = matrix[("exactly-once", MID_SINK_WRITE)].crashes[0]["facts"]
    assert facts == {"offsets_logged": True, "checkpoint_committed": False, "sink_has_batch": False, "sink_txn": False,
                     "write_started": ["delta"]}  # fmt: skip


def test_a_cell_s_restart_is_timed_and_its_report_renders(matrix: Matrix, tmp_path: Path) -> None:
    cell = matrix[WEAKER]
    assert cell.restart_s is not None and cell.restart_s > 0
    assert {"guarantee", "sink", "point", "lost", "duplicated", "unexpected", "crashes", "restart_s"} <= set(
        cell.to_dict()
    )
    page = matrix_html([cell], "streamproof prove --matrix")
    assert page.count("<svg") == 1 and f"<td class='{cell.outcome}'>" in page
    assert f"duplicated {cell.duplicated:,}<br>" in page
    (tmp_path / "matrix.html").write_text(page)
