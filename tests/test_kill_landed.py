"""A random kill counts only if it landed: the killed run must end by SIGKILL. Real ``streamproof run`` children and
no JVM: one refused at once (no such pipeline file: exit 2 before Spark is touched) ends on its own before the kill;
one blocked reading its pipeline file (a FIFO no one writes) is alive when it is killed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from streamproof.errors import PipelineError
from streamproof.harness.crashes import Harness


def test_a_run_that_ended_on_its_own_before_the_kill_is_a_missed_kill(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "no-such-pipeline.toml", tmp_path / "logs", emit=lambda line: None)
    try:
        run = harness.start()
        assert run.child.process.wait(timeout=60) == 2  # refused: the run exits before any kill
        with pytest.raises(PipelineError) as missed:
            harness.kill(run, "kill 1/2")
    finally:
        harness.finish()
    assert str(missed.value) == (
        f"kill 1/2 missed: run 1 exited with code 2 instead of dying by SIGKILL; log: {run.child.log_path}"
    )
    assert "no such pipeline file" in run.child.log_path.read_text() + run.child.out_path.read_text()


def test_a_run_still_running_when_killed_dies_by_sigkill_and_the_kill_landed(tmp_path: Path) -> None:
    pipeline = tmp_path / "pipeline.toml"
    os.mkfifo(pipeline)  # reading it blocks: the run waits before Spark, until it is killed
    harness = Harness(pipeline, tmp_path / "logs", emit=lambda line: None)
    try:
        run = harness.start()
        time.sleep(1.0)
        assert run.child.process.poll() is None, "the run should still be running"
        before = time.monotonic()
        killed_at = harness.kill(run, "kill 1/2")
    finally:
        harness.finish()
    assert run.child.process.returncode == -signal.SIGKILL
    assert before <= killed_at <= time.monotonic()
