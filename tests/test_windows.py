"""Windows after dedup stay exactly-once through crashes: every closed window is written once, with the sums and
count a recomputation from the source gives.

Data as in test_dedup.py (conftest.STATEFUL_EVENTS: 12,000 records, 3% resends, 1% late, 0.5% malformed). Pipeline:
examples/customer_windows_to_delta.toml with 1-minute windows per status and a 1-minute delay, three batches.
A crash-matrix cell, exactly-once, after-sink-commit (every point:
`streamproof prove examples/customer_windows_to_delta.toml --matrix`), one SIGKILL in batch 1: 0 lost,
0 duplicated, 0 unexpected windows; the records of still-open windows counted as pending; and
``source_records = in closed windows + in open windows + quarantined + upstream_duplicates``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import STATEFUL_DATA as UPSTREAM
from conftest import STATEFUL_EVENTS as EVENTS
from conftest import stateful_example
from streamproof.config import load_pipeline
from streamproof.faults.points import AFTER_SINK_COMMIT
from streamproof.harness.cells import MatrixCell
from streamproof.harness.matrix import run_matrix
from streamproof.infra import KafkaBroker
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.timeout(1200)]

# The suite's 30-minute budget keeps one cell: the replay of a batch whose windows Delta already holds.
POINTS = (AFTER_SINK_COMMIT,)


@pytest.fixture(scope="module")
def window_matrix_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("window-matrix")


@pytest.fixture(scope="module")
def window_matrix(kafka_broker: KafkaBroker, spark: Any, window_matrix_dir: Path) -> dict[str, MatrixCell]:
    base = stateful_example(window_matrix_dir / "base", kafka_broker.bootstrap_servers, "windows",
                          example="customer_windows_to_delta.toml")  # fmt: skip
    cells = run_matrix(base, spark, workdir=window_matrix_dir, count=EVENTS, seed=19, guarantees=("exactly-once",),
                       points=POINTS, **UPSTREAM)  # fmt: skip
    return {cell.point: cell for cell in cells}


@pytest.mark.parametrize("point", POINTS)
def test_windows_are_written_once_through_a_crash(
    window_matrix: dict[str, MatrixCell], window_matrix_dir: Path, spark: Any, point: str
) -> None:
    cell = window_matrix[point]
    assert len(cell.crashes) == 1 and cell.crashes[0]["batch_id"] == 1, cell.to_dict()
    assert (cell.lost, cell.duplicated, cell.unexpected) == (0, 0, 0), cell.to_dict()
    spec = load_pipeline(window_matrix_dir / f"exactly-once-{point}" / "pipeline.toml")
    (report,) = verify_pipeline(spark, spec)
    # Windows, sums and late records recomputed by the independent checker agree term by term.
    assert disagreements([report], verify_independently(spec)) == []
    assert report.unit == "windows" and report.expected == report.sink_records > 0
    assert report.identity_holds and report.source_records == EVENTS, report.to_json()
    assert report.aggregated > 0 and report.pending > 0 and report.upstream_duplicates > 0, report.to_json()
    assert report.quarantine_reasons.get("late", 0) > 0
