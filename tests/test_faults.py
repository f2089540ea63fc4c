"""Crash points: parsed strictly, armed only in a process that leads its group, and a real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streamproof.errors import ConfigError
from streamproof.faults.in_tasks import (
    CrashInTask,
    HeldForTheHarness,
    MachineLoss,
    SlowFirstAttempt,
    fires_once,
    task_fault,
)
from streamproof.faults.points import ArmedCrash, parse_crash, parse_crashes
from streamproof.harness.cluster import write_attempts
from streamproof.harness.crashes import runs_of
from streamproof.infra import process_alive


def test_crash_spec_is_point_and_batch() -> None:
    assert parse_crash("after-sink-commit@12") == ArmedCrash("after-sink-commit", 12)
    assert parse_crash("mid-sink-write:pg-totals@3") == ArmedCrash("mid-sink-write", 3, "pg-totals")
    assert ArmedCrash("mid-sink-write", 3, "pg-totals").encode() == "mid-sink-write:pg-totals@3"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("after-sink-commit", "expected <point>@<batch id>"),
        ("mid-sink-write@x", "expected <point>@<batch id>"),
        ("sometime@3", "expected one of before-sink-write"),
        ("random@1", "expected one of before-sink-write"),
        ("after-sink-commit:kafka@1", "expected one of before-sink-write"),  # only mid-sink-write names a sink
    ],
)
def test_bad_crash_spec_is_refused(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_crash(text)


def test_faults_of_the_machines_share_a_run_a_batch_each() -> None:
    """A run may carry one crash of the driver (it ends the run) and faults of the machines, one per batch."""
    assert parse_crashes("executor-mid-write:pg@2, speculation@3") == [
        ArmedCrash("executor-mid-write", 2, "pg"),
        ArmedCrash("speculation", 3),
    ]
    with pytest.raises(ConfigError, match="one crash of the driver per run"):
        parse_crashes("after-sink-commit@1,before-sink-write@2")
    with pytest.raises(ConfigError, match="one point per batch"):
        parse_crashes("worker-loss@2,speculation@2")
    assert runs_of(["mid-sink-write", "worker-loss:a", "worker-loss:b", "after-sink-commit", "speculation"]) == [
        ["mid-sink-write"],
        ["worker-loss:a", "worker-loss:b"],
        ["after-sink-commit"],
        ["speculation"],
    ]


def test_each_write_point_is_met_in_the_last_task() -> None:
    kinds = {point: type(task_fault(point, partitions=3, batch_id=5)) for point in
             ("mid-sink-write", "speculation", "executor-mid-write", "worker-loss", "datanode-restart")}  # fmt: skip
    assert kinds == {"mid-sink-write": CrashInTask, "speculation": SlowFirstAttempt,
                     "executor-mid-write": MachineLoss, "worker-loss": MachineLoss,
                     "datanode-restart": HeldForTheHarness}  # fmt: skip
    fault = task_fault("worker-loss", partitions=3, batch_id=5)
    assert isinstance(fault, MachineLoss) and (fault.partition_id, fault.marker) == (2, "worker-loss@5")
    assert task_fault(None, partitions=3) is None


def test_a_fault_of_the_machines_fires_once_per_batch(tmp_path: object) -> None:
    """Spark's retry of the task, or a re-run of its stage, must not fire it again (attempt numbers restart)."""
    folder = str(tmp_path)
    assert fires_once(folder, "executor-mid-write@2") is True
    assert fires_once(folder, "executor-mid-write@2") is False
    assert fires_once(folder, "executor-mid-write@3") is True


_CHILD = """
import os, time
from streamproof.faults import points as faults
faults.arm_from_environment()
child = os.fork()
if child == 0:          # a grandchild in the same group, like the Spark JVM
    os.close(1); os.close(2)   # not holding the test's pipes open
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
faults.reached("before-sink-write", 3)
print("survived", flush=True)
"""


def test_reached_point_sigkills_the_whole_process_group() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env={**os.environ, "STREAMPROOF_CRASH_AT": "before-sink-write@3"},
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == -signal.SIGKILL
    assert "survived" not in done.stdout
    grandchild = int(done.stdout.split()[0])
    deadline = time.monotonic() + 5  # the kernel delivers the group kill to each member; allow it to land
    while process_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(grandchild)


def test_other_batches_and_points_do_not_crash() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.replace('"before-sink-write", 3', '"before-sink-write", 2')],
        env={**os.environ, "STREAMPROOF_CRASH_AT": "before-sink-write@3"},
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 0 and "survived" in done.stdout
    os.kill(int(done.stdout.split()[0]), signal.SIGKILL)


def test_arming_outside_a_group_leader_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from streamproof.faults import points; points.arm_from_environment()"],
        env={**os.environ, "STREAMPROOF_CRASH_AT": "before-sink-write@3"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "does not lead its process group" in done.stderr


@pytest.mark.parametrize(
    ("guarantee", "point", "invalid", "check", "partial", "expected"),
    [
        # Measured in `streamproof prove <all sinks> --matrix` (50k events, 0.5% malformed): the quarantine table
        # is appended again on an at-least-once replay even where the sink itself absorbs it (MERGE, upsert).
        ("at-least-once", "after-sink-commit", True, "latest", False, "duplicated"),
        ("at-least-once", "after-sink-commit", False, "latest", False, "clean"),
        ("at-least-once", "after-sink-commit", False, "records", False, "duplicated"),
        ("at-least-once", "mid-sink-write", True, "latest", True, "duplicated"),
        ("at-least-once", "mid-sink-write", False, "records", True, "may-duplicate"),
        ("at-least-once", "before-sink-write", True, "records", False, "clean"),
        ("at-most-once", "before-sink-write", True, "totals", False, "lost"),
        ("at-most-once", "mid-sink-write", True, "records", True, "may-lose"),
        ("at-most-once", "after-sink-commit", True, "records", False, "clean"),
        ("exactly-once", "after-sink-commit", True, "records", True, "clean"),
    ],
)
def test_expected_damage_of_each_guarantee_at_each_point(
    guarantee: str, point: str, invalid: bool, check: str, partial: bool, expected: str
) -> None:
    from streamproof.harness.cells import expected_damage

    damage = expected_damage(guarantee, point, has_invalid_records=invalid, check=check, partial_writes_visible=partial)
    assert damage == expected


def test_write_attempts_reads_only_the_batch_and_sink_asked_for(tmp_path: Path) -> None:
    """Spark's event log of a cluster run: batch 21's job is not batch 2's, and a sink's filter keeps its own."""

    def job(stage: int, group: str) -> dict[str, Any]:
        return {"Event": "SparkListenerJobStart", "Stage IDs": [stage], "Properties": {"spark.jobGroup.id": group}}

    def task(stage: int, reason: str, attempt: int = 0, speculative: bool = False) -> dict[str, Any]:
        return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task End Reason": {"Reason": reason},
                "Task Info": {"Attempt": attempt, "Speculative": speculative}}  # fmt: skip

    events = [job(1, "streamproof-2-delta"), job(2, "streamproof-2-kafka"), job(3, "streamproof-21-delta"),
              task(1, "ExecutorLostFailure", attempt=1), task(2, "Success", speculative=True),
              task(3, "Success")]  # fmt: skip
    (tmp_path / "app-1").write_text("\n".join(json.dumps(event) for event in events) + "\n{torn")
    assert write_attempts(tmp_path, 2, "delta") == {
        "attempts": 1, "retried": 1, "speculative": 0, "failed": 1, "ends": {"ExecutorLostFailure": 1}}  # fmt: skip
    assert write_attempts(tmp_path, 2) == {"attempts": 2, "retried": 1, "speculative": 1, "failed": 1,
                                           "ends": {"ExecutorLostFailure": 1, "Success": 1}}  # fmt: skip
