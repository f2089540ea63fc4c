"""``streamproof maintain``'s refusals: made before a table is touched (those the pipeline file and the run lock
decide: no Spark session is given, and none is needed to refuse), or before any VACUUM (a ``--where`` that no table
takes, known after OPTIMIZE tried it: on a real Delta table)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import REPO, run_cli
from streamproof.checkpoint.folder import RunLock
from streamproof.config import dump_pipeline, load_pipeline, parse_pipeline
from streamproof.errors import ConfigError, PipelineError
from streamproof.maintenance import maintain


def test_a_where_for_a_pipeline_without_a_partitioned_table_is_refused_before_any_table_is_vacuumed() -> None:
    """``--optimize --where P --vacuum H`` on a pipeline none of whose Delta tables is partitioned: the ``--where``
    cannot apply, which the pipeline file says. It used to be refused after VACUUM had deleted files of every table;
    now nothing runs (a session of None would fail at the first table)."""
    spec = load_pipeline(REPO / "examples" / "orders_to_delta.toml")
    with pytest.raises(ConfigError) as refusal:
        list(maintain(cast(Any, None), spec, compact=True, vacuum_hours=200, where="order_bucket = 0"))
    assert str(refusal.value) == (
        "--where: the pipeline has no partitioned Delta table (a sink's partition_by): leave --where out to compact "
        "whole tables"
    )


def test_a_short_vacuum_while_the_pipeline_runs_is_refused_before_optimize_commits_to_any_table(
    tmp_path: Path,
) -> None:
    """``--optimize --vacuum 1 --allow-short-retention`` while a process holds the pipeline's run lock: refused in one
    line before the first table is touched. It used to OPTIMIZE the first table, then refuse at its VACUUM."""
    spec = load_pipeline(REPO / "examples" / "orders_to_delta.toml")
    spec = spec.model_copy(update={"checkpoint": str(tmp_path / "checkpoint")})
    (tmp_path / "checkpoint").mkdir()
    running = subprocess.Popen(["sleep", "60"])  # the pipeline's process, as its lock file names it
    try:
        (tmp_path / "checkpoint" / RunLock.NAME).write_text(f"{running.pid}@{socket.gethostname()}")
        with pytest.raises(PipelineError) as refusal:
            list(maintain(cast(Any, None), spec, compact=True, vacuum_hours=1, allow_short_retention=True))
    finally:
        running.kill()
        running.wait()
    assert str(refusal.value) == (
        f"pipeline {spec.name!r} is running (pid {running.pid}): a short VACUUM would delete the files of the batch it "
        "is writing; stop it first"
    )


@pytest.mark.integration
def test_a_pipeline_started_during_a_short_vacuum_is_refused_naming_it(tmp_path: Path, spark: Any) -> None:
    """``--vacuum 1 --allow-short-retention`` holds the pipeline's run lock while it runs: a start meanwhile is
    refused naming `streamproof maintain` (before, the VACUUM only looked for a running pipeline at its start, and one
    started after that look had the files of its first batch deleted under it); the lock is gone when it ends."""
    spec = load_pipeline(REPO / "examples" / "orders_to_delta.toml")
    spec = spec.model_copy(update={"checkpoint": str(tmp_path / "checkpoint")})
    (tmp_path / "checkpoint").mkdir()
    steps = maintain(spark, spec, compact=False, vacuum_hours=1, allow_short_retention=True)
    first = next(steps)  # the first table's line: the command is under way
    assert "not written yet" in first, first
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(dump_pipeline(spec))
    started = run_cli("run", str(pipeline_file), "--available-now", timeout=120)
    assert started.returncode == 2, started.stdout[-2000:] + started.stderr[-2000:]
    assert f"is in use by `streamproof maintain` (pid {os.getpid()}" in started.stderr, started.stderr
    assert list(steps)  # the rest of it
    assert not (tmp_path / "checkpoint" / RunLock.NAME).exists()


@pytest.mark.integration
def test_a_where_no_partitioned_table_takes_is_refused_before_any_vacuum(tmp_path: Path, spark: Any) -> None:
    """``--optimize --where P --vacuum H`` where P names no partition column of the one partitioned table: every
    OPTIMIZE is skipped, which makes the ``--where`` a mistake; it is refused before VACUUM runs on any table, where it
    used to be refused after each table's VACUUM."""
    table = tmp_path / "orders"
    spark.createDataFrame([("a", "2026-11-01")], "event_id STRING, day STRING").write.format("delta").partitionBy(
        "day"
    ).save(str(table))
    spec = parse_pipeline(f"""
name = "kept"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
topic = "kept"
[transform]
schema = "event_id STRING, day STRING"
quarantine = "{tmp_path}/quarantine"
[sink]
kind = "delta"
path = "{table}"
partition_by = ["day"]
""")
    lines = []
    with pytest.raises(ConfigError) as refusal:
        for line in maintain(spark, spec, compact=True, vacuum_hours=200, where="order_bucket = 0"):
            lines.append(line)
    assert str(refusal.value).startswith("--where 'order_bucket = 0': "), str(refusal.value)
    assert not any("VACUUM" in line for line in lines), lines
    assert lines == [
        f"{tmp_path / 'quarantine'}: not written yet, skipped",
        f"{table}: OPTIMIZE skipped: {refusal.value}",
    ]
