"""``streamproof maintain``'s refusals that the pipeline file decides: made before a table is touched (pure Python:
no Spark session is given, and none is needed to refuse)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from conftest import REPO
from streamproof.checkpoint.folder import RunLock
from streamproof.config import load_pipeline
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
