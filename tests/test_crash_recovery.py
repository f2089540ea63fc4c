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
