"""Exactly-once through real crashes: the pipeline process group is SIGKILLed at seeded random moments
while batches are being written, restarted, drained, and reconciled record by record.

Fault: 2 x SIGKILL of the driver's process group (Python + Spark JVM), seed 20261122.
Expected: 100,000 source records, lost 0, duplicated 0, unexpected 0, quarantined = generator's malformed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import write_pipeline
from streamproof.config import load_pipeline
from streamproof.faults.points import surviving_processes
from streamproof.generator import generate
from streamproof.harness.random_kills import run_with_random_kills
from streamproof.infra import KafkaBroker
from streamproof.reconcile import verify_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SEED = 20261122


def test_two_random_sigkills_lose_nothing_and_duplicate_nothing(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    generated = generate(
        kafka_broker.bootstrap_servers, "crash-orders", 100_000, partitions=4, malformed=0.005, seed=SEED
    )
    pipeline_file = write_pipeline(
        tmp_path, name="crash", topic="crash-orders", bootstrap=kafka_broker.bootstrap_servers, max_offsets=10_000
    )
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)  # shown by pytest on failure: the kill moments, to replay

    harness = run_with_random_kills(pipeline_file, kills=2, seed=SEED, log_dir=tmp_path / "logs", emit=emit)

    assert len(harness.crashes) == 2
    assert sum(1 for line in lines if line.startswith("kill ")) == 2
    assert harness.runs == 3
    for crash in harness.crashes:
        assert crash.restarted_in_s is not None and crash.restarted_in_s > 0
    assert len(harness.process_groups) == 3
    assert surviving_processes(harness.process_groups) == [], "a pipeline process (driver or JVM) survived"

    (report,) = verify_pipeline(spark, load_pipeline(pipeline_file))
    assert report.source_records == 100_000
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_json()
    assert report.quarantined == generated.malformed
    assert report.sink_records == 100_000 - generated.malformed


def test_batch_0_into_a_table_another_writer_restored_is_written_once_through_a_sigkill_after_its_commit(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """A sink table of 12 versions another writer RESTOREd before the pipeline's first batch: the pipeline commits
    batch 0 under its appId marked with that RESTORE, and is SIGKILLed (its process group) right after that commit,
    before Spark's. The next run replays batch 0 and must skip it: every record of the topic once in the table."""
    import os
    import subprocess
    import sys

    from pyspark.sql import functions as F

    from streamproof.faults.points import AFTER_SINK_COMMIT, CRASH_ENV
    from streamproof.transform.records import sink_rows_schema

    generated = generate(kafka_broker.bootstrap_servers, "restored-orders", 2_000, partitions=2, malformed=0, seed=7)
    pipeline_file = write_pipeline(
        tmp_path, name="restored", topic="restored-orders", bootstrap=kafka_broker.bootstrap_servers, max_offsets=1_000
    )
    spec = load_pipeline(pipeline_file)
    assert spec.sink is not None
    table = str(spec.sink.path)
    schema = sink_rows_schema(spark, spec.transform)
    for offset in range(12):  # another writer's rows, of the pipeline's columns
        row = [F.lit(None).cast(field.dataType).alias(field.name) for field in schema.fields]
        other = spark.range(1).select(*row).withColumn("_src_topic", F.lit("another-writer"))
        other.withColumn("_src_offset", F.lit(offset).cast("bigint")).write.format("delta").mode("append").save(table)
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF 5")

    command = [sys.executable, "-m", "streamproof", "run", str(pipeline_file), "--available-now"]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=600, start_new_session=True,
                            env={**os.environ, CRASH_ENV: f"{AFTER_SINK_COMMIT}@0"})  # fmt: skip
    assert killed.returncode < 0, killed.stderr[-2000:]  # SIGKILLed, by its own crash point
    drained = subprocess.run(command, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert drained.returncode == 0, drained.stderr[-2000:]

    rows = spark.read.format("delta").load(table).where("_src_topic = 'restored-orders'")
    assert rows.count() == generated.count == 2_000
    assert rows.select("_src_partition", "_src_offset").distinct().count() == 2_000
