"""Kafka -> Spark -> Delta, exactly-once, through the CLI a user types; and the checker catching damage.

Faults injected here: none in the main run (a clean drain must reconcile exactly), then hand-made damage on
a copy of the sink (negative control), then a deleted checkpoint (the start must be refused).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli, write_pipeline
from streamproof.generator import GenerationResult, generate
from streamproof.infra import KafkaBroker

pytestmark = pytest.mark.integration

EVENTS = 20_000
MALFORMED = 0.005


@dataclass
class DrainedPipeline:
    pipeline_file: Path
    workdir: Path
    generated: GenerationResult
    run_stdout: str


@pytest.fixture(scope="module")
def drained(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> DrainedPipeline:
    workdir = tmp_path_factory.mktemp("e2e")
    generated = generate(
        kafka_broker.bootstrap_servers, "e2e-orders", EVENTS, partitions=4, malformed=MALFORMED, seed=2026
    )
    pipeline_file = write_pipeline(
        workdir, name="e2e", topic="e2e-orders", bootstrap=kafka_broker.bootstrap_servers, max_offsets=5_000
    )
    done = run_cli("run", str(pipeline_file), "--available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    return DrainedPipeline(pipeline_file, workdir, generated, done.stdout)


def _verify(pipeline_file: Path, report_file: Path) -> tuple[int, dict[str, Any]]:
    done = run_cli("verify", str(pipeline_file), "--json", str(report_file))
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(report_file.read_text())


def test_drained_run_reconciles_exactly(drained: DrainedPipeline) -> None:
    code, report = _verify(drained.pipeline_file, drained.workdir / "report.json")
    malformed = drained.generated.malformed
    assert malformed > 0
    assert report["source_records"] == EVENTS
    assert report["expected"] == EVENTS - malformed
    assert report["sink_records"] == EVENTS - malformed
    assert report["quarantined"] == malformed
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0)
    assert report["ok"] is True and code == 0
    assert sum(report["quarantine_reasons"].values()) == malformed
    # The quarantine table was created empty before the query started (BatchWriter.create_quarantine_table), so
    # batch 0 committed into it; the sink's table is created by its first batch. A batch's few quarantined records
    # are one file (streamproof.pipeline.batches.QUARANTINE_ONE_FILE_ROWS), not one per Kafka partition (the topic
    # has 4).
    first = (drained.workdir / "tables" / "orders_quarantine" / "_delta_log" / f"{0:020d}.json").read_text()
    assert '"operation":"CREATE TABLE"' in first and '"add"' not in first, first
    first = (drained.workdir / "tables" / "orders" / "_delta_log" / f"{0:020d}.json").read_text()
    assert '"operation":"WRITE"' in first and '"add"' in first, first
    commits = sorted((drained.workdir / "tables" / "orders_quarantine" / "_delta_log").glob("*.json"))
    added = [sum('"add"' in line for line in commit.read_text().splitlines()) for commit in commits]
    assert len(added) >= 3 and added[0] == 0 and set(added[1:]) == {1}, added


def test_run_prints_one_line_per_batch(drained: DrainedPipeline) -> None:
    batch_lines = [line for line in drained.run_stdout.splitlines() if " committed: " in line]
    assert len(batch_lines) >= EVENTS // 15_000
    assert all("rows/s" in line and "kafka lag" in line for line in batch_lines)
    assert batch_lines[-1].endswith("kafka lag 0")
    rows_in = sum(int(line.split("committed: ")[1].split(" rows in")[0]) for line in batch_lines)
    assert rows_in == EVENTS


def test_negative_control_one_duplicate_and_one_loss_are_reported(drained: DrainedPipeline, spark: Any) -> None:
    from delta.tables import DeltaTable

    damaged = drained.workdir / "damaged"
    shutil.copytree(drained.workdir / "tables", damaged / "tables")
    shutil.copytree(drained.workdir / "checkpoint", damaged / "checkpoint")
    pipeline_file = damaged / "pipeline.toml"
    pipeline_file.write_text(drained.pipeline_file.read_text().replace(str(drained.workdir), str(damaged)))
    sink = str(damaged / "tables" / "orders")
    rows = spark.read.format("delta").load(sink).orderBy("_src_partition", "_src_offset").limit(2).collect()
    spark.createDataFrame([rows[0]], spark.read.format("delta").load(sink).schema).write.format("delta").mode(
        "append"
    ).save(sink)
    DeltaTable.forPath(spark, sink).delete(
        f"_src_partition = {rows[1]['_src_partition']} AND _src_offset = {rows[1]['_src_offset']}"
    )

    code, report = _verify(pipeline_file, damaged / "report.json")
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (1, 1, 0)
    assert report["ok"] is False
    assert code == 1


def test_lost_checkpoint_is_refused_not_silently_replayed(drained: DrainedPipeline) -> None:
    moved = drained.workdir / "checkpoint-moved-away"
    shutil.move(drained.workdir / "checkpoint", moved)
    try:
        done = run_cli("run", str(drained.pipeline_file), "--available-now")
        assert done.returncode == 2
        assert "is empty but" in done.stderr and "the checkpoint was lost" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        shutil.rmtree(drained.workdir / "checkpoint", ignore_errors=True)
        shutil.move(moved, drained.workdir / "checkpoint")


def test_missing_topic_is_a_clear_error(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    pipeline_file = write_pipeline(
        tmp_path, name="nothing", topic="no-such-topic", bootstrap=kafka_broker.bootstrap_servers, max_offsets=1000
    )
    done = run_cli("run", str(pipeline_file), "--available-now", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: topic 'no-such-topic' does not exist on 127.0.0.1:")
