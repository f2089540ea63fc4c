"""Deduplication with a watermark stays exactly-once through a crash; every record is accounted for.

Data: 30,000 generated records per run, 3% resends of earlier events (same event_id and event time, some into
another partition, some from far back), 1% events 6 hours behind the stream, 0.5% malformed. Pipeline:
examples/orders_dedup_to_delta.toml with a 1-minute watermark delay (the records span 5 minutes, so resends
from far back are late too), three batches.

* a crash-matrix cell, exactly-once, after-sink-commit (the sink and the dedup state ahead of the checkpoint;
  every point: `streamproof prove examples/orders_dedup_to_delta.toml --matrix`), one SIGKILL in batch 1:
  0 lost, 0 duplicated, 0 unexpected at event level (one sink row per distinct event_id), and
  ``source_records = expected + quarantined + upstream_duplicates`` with every term non-zero, the late
  records in quarantine with reason ``late``;
* ``dedup.late = "drop"``: late records are in neither table and verify counts them as ``dropped_late``;
  checked against the quarantine configuration, the same tables show them lost (the checker sees the gap).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import STATEFUL_DATA as UPSTREAM
from conftest import STATEFUL_EVENTS as EVENTS
from conftest import run_cli, stateful_example
from streamproof.config import dump_pipeline, load_pipeline, parse_pipeline
from streamproof.faults.points import AFTER_SINK_COMMIT
from streamproof.generator import generate
from streamproof.harness.cells import MatrixCell
from streamproof.harness.matrix import run_matrix
from streamproof.infra import KafkaBroker
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.timeout(1500)]

# Each cell is two pipeline runs (~70 s in CI); the suite's 30-minute budget keeps the cell where the sink and the
# dedup state have both moved past the checkpoint. Every point: `streamproof prove ... --matrix` (docs/transforms.md).
POINTS = (AFTER_SINK_COMMIT,)


@pytest.fixture(scope="module")
def matrix_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dedup-matrix")


@pytest.fixture(scope="module")
def matrix(kafka_broker: KafkaBroker, spark: Any, matrix_dir: Path) -> dict[str, MatrixCell]:
    base = stateful_example(matrix_dir / "base", kafka_broker.bootstrap_servers, "dedup")
    cells = run_matrix(base, spark, workdir=matrix_dir, count=EVENTS, seed=17, guarantees=("exactly-once",),
                       points=POINTS, **UPSTREAM)  # fmt: skip
    return {cell.point: cell for cell in cells}


@pytest.mark.parametrize("point", POINTS)
def test_dedup_is_exactly_once_through_a_crash(matrix: dict[str, MatrixCell], point: str) -> None:
    cell = matrix[point]
    assert len(cell.crashes) == 1 and cell.crashes[0]["batch_id"] == 1, cell.to_dict()
    assert (cell.lost, cell.duplicated, cell.unexpected) == (0, 0, 0), cell.to_dict()


@pytest.mark.parametrize("point", POINTS)
def test_every_record_is_accounted_for_after_the_crash(
    matrix: dict[str, MatrixCell], matrix_dir: Path, spark: Any, point: str
) -> None:
    spec = load_pipeline(matrix_dir / f"exactly-once-{point}" / "pipeline.toml")
    (report,) = verify_pipeline(spark, spec)
    assert report.source_records == EVENTS
    assert report.identity_holds, report.to_json()
    assert report.upstream_duplicates > 0 and report.quarantine_reasons.get("late", 0) > 0, report.to_json()
    assert report.dropped_late == 0
    assert report.expected == report.sink_records
    # Dedup keys, late flags from the offset log: the independent checker recomputes both on its own.
    assert disagreements([report], verify_independently(spec)) == []


def test_late_records_dropped_by_configuration_are_counted(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    topic = "dedup-drop"
    generate(kafka_broker.bootstrap_servers, topic, EVENTS, partitions=4, seed=18, **UPSTREAM)
    pipeline = stateful_example(tmp_path, kafka_broker.bootstrap_servers, topic, late="drop")
    result = run_cli("run", str(pipeline), "--available-now")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "late (dropped)" in result.stdout
    assert "counted" not in result.stdout  # Spark's own count of late records agreed with the batch writer's

    spec = load_pipeline(pipeline)
    (report,) = verify_pipeline(spark, spec)
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_json()
    assert report.dropped_late > 0 and "late" not in report.quarantine_reasons
    assert report.identity_holds and report.expected == report.sink_records

    # The same tables judged as if late records had to be quarantined: each dropped one is missing there.
    dedup = spec.transform.dedup
    assert dedup is not None
    strict = parse_pipeline(dump_pipeline(spec.model_copy(update={
        "transform": spec.transform.model_copy(update={"dedup": dedup.model_copy(update={"late": "quarantine"})}),
    })))  # fmt: skip
    (strict_report,) = verify_pipeline(spark, strict)
    assert strict_report.lost == report.dropped_late
    assert disagreements([report], verify_independently(spec)) == []  # dropped late records counted alike
