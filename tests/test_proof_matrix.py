"""The proof matrix, CI-sized: Delta append; exactly-once where a crash finds the write begun (mid-sink-write), and
at-least-once where it duplicates (after-sink-commit): 2 cells (the 25-minute CI budget). ``prove --matrix``
runs all 12. Elsewhere in CI: exactly-once after the sink commit on a Delta append (test_dedup.py) and on every
other sink, and at-most-once's loss on two sinks (test_sinks_exactly_once.py); before the write and after the
checkpoint commit nothing is in flight, and ``prove --matrix`` proves them. 8,000 events per cell (0.5% malformed),
each cell on a fresh topic, table and checkpoint, one SIGKILL of the pipeline's process group in batch 1, restart
until drained, record-by-record reconciliation.

Expected: exactly-once 0/0; at-least-once duplicates after-sink-commit and never loses. A cell
that should show damage and shows none fails the test: a blind harness is a bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import write_pipeline
from streamproof.faults import AFTER_SINK_COMMIT, MID_SINK_WRITE
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


@pytest.fixture(scope="module")
def matrix(kafka_broker: KafkaBroker, spark: Any, matrix_workdir: Path) -> dict[tuple[str, str], MatrixCell]:
    pipeline_file = write_pipeline(
        matrix_workdir / "base", name="matrix", topic="matrix", bootstrap=kafka_broker.bootstrap_servers,
        max_offsets=4_000,
    )  # fmt: skip
    data: dict[str, Any] = {"count": 8_000, "malformed": 0.005, "seed": 7}
    cells = run_matrix(pipeline_file, spark, workdir=matrix_workdir, guarantees=("exactly-once",), points=POINTS,
                       **data)  # fmt: skip
    for guarantee, point in sorted(WEAKER_CELLS):
        cells += run_matrix(pipeline_file, spark, workdir=matrix_workdir, guarantees=(guarantee,), points=(point,),
                            **data)  # fmt: skip
    return {(cell.guarantee, cell.point): cell for cell in cells}


def test_matrix_has_every_cell(matrix: dict[tuple[str, str], MatrixCell]) -> None:
    assert set(matrix) == CELLS
    assert all(len(cell.crashes) == 1 and cell.crashes[0]["batch_id"] == 1 for cell in matrix.values())


@pytest.mark.parametrize("point", POINTS)
def test_exactly_once_is_clean(matrix: dict[tuple[str, str], MatrixCell], point: str) -> None:
    cell = matrix[("exactly-once", point)]
    assert (cell.lost, cell.duplicated, cell.unexpected) == (0, 0, 0), cell.to_dict()


def test_at_least_once_duplicates_after_sink_commit_and_never_loses(matrix: dict[tuple[str, str], MatrixCell]) -> None:
    cell = matrix[("at-least-once", AFTER_SINK_COMMIT)]
    assert cell.duplicated > 0 and (cell.lost, cell.unexpected) == (0, 0), cell.to_dict()


def test_every_cell_shows_exactly_the_damage_its_guarantee_predicts(matrix: dict[tuple[str, str], MatrixCell]) -> None:
    surprises = {key: (cell.outcome, cell.expected) for key, cell in matrix.items() if not cell.as_expected}
    assert surprises == {}


def test_after_sink_commit_kill_lands_between_sink_and_commit_log(matrix: dict[tuple[str, str], MatrixCell]) -> None:
    facts = matrix[("at-least-once", AFTER_SINK_COMMIT)].crashes[0]["facts"]
    assert facts["sink_has_batch"] is True  # the sink transaction was durable...
    assert facts["checkpoint_committed"] is False  # ...and Spark's commits/<batch> was not written
    assert facts["sink_txn"] is False  # only exactly-once keys the write on the batch


def test_kill_mid_write_leaves_nothing_in_the_sink(matrix: dict[tuple[str, str], MatrixCell]) -> None:
    facts = matrix[("exactly-once", MID_SINK_WRITE)].crashes[0]["facts"]
    assert facts == {"offsets_logged": True, "checkpoint_committed": False, "sink_has_batch": False, "sink_txn": False,
                     "write_started": ["delta"]}  # fmt: skip


def test_restarts_are_timed_and_reports_render(matrix: dict[tuple[str, str], MatrixCell], tmp_path: Path) -> None:
    for cell in matrix.values():
        assert cell.restart_s is not None and cell.restart_s > 0
        assert {"guarantee", "sink", "point", "lost", "duplicated", "unexpected", "crashes", "restart_s"} <= set(
            cell.to_dict()
        )
    page = matrix_html(list(matrix.values()), "streamproof prove --matrix")
    assert page.count("<svg") == len(CELLS) and page.count("class='clean") >= 1
    (tmp_path / "matrix.html").write_text(page)


def test_vacuum_removes_the_files_a_killed_write_left_and_the_table_reads_the_same(
    matrix: dict[tuple[str, str], MatrixCell], matrix_workdir: Path, spark: Any
) -> None:
    """Fault: the SIGKILL in the middle of batch 1's Delta write (exactly-once cell). Its data files stay on
    disk, referenced by no commit; VACUUM with a zero retention deletes exactly those, OPTIMIZE compacts the
    rest, and the table's rows are the same before and after."""
    from streamproof.config import load_pipeline
    from streamproof.maintenance import optimize, unreferenced_files, vacuum
    from streamproof.reconcile import verify_pipeline

    assert matrix[("exactly-once", MID_SINK_WRITE)].crashes
    cell = matrix_workdir / f"exactly-once-{MID_SINK_WRITE}"
    spec = load_pipeline(cell / "pipeline.toml")
    table = cell / "tables" / "delta"
    rows = sorted(spark.read.format("delta").load(str(table)).select("_src_partition", "_src_offset").collect())
    orphans = unreferenced_files(spark, table)
    assert orphans, "the killed write left no data file behind: the crash did not land mid-write"

    result = vacuum(spark, spec, table, retention_hours=0, allow_short_retention=True)
    assert result.deleted_files == len(orphans)
    assert unreferenced_files(spark, table) == [] and not any(path.exists() for path in orphans)
    compacted = optimize(spark, table)
    assert compacted.files_removed > compacted.files_added >= 1
    after = sorted(spark.read.format("delta").load(str(table)).select("_src_partition", "_src_offset").collect())
    assert after == rows
    (report,) = verify_pipeline(spark, spec)
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0)
