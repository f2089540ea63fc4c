"""Faults met inside a sink's write tasks, where Spark runs them (PySpark workers on the executors): what the write
of a batch armed with a point of a write (:data:`streamproof.faults.points.WRITE_POINTS`) does at its mid-write point.

The last partition of the write is the one affected. A sink writing from Python tasks (PostgreSQL, Kafka) calls
``reached`` at its own mid-write point (rows written, nothing committed); in front of a JVM writer (Delta, Parquet)
:func:`held_back` adds a Python stage that calls it halfway through the task's rows.

A fault of the machines fires once per batch, in the first attempt that reaches it: a marker file, created with
``O_EXCL`` in the fault folder (``$STREAMPROOF_FAULT_DIR``, set by the harness), says it already fired, so that
neither Spark's retry of the task nor a re-run of its stage (its attempts count from 0 again) fires it twice. The
folder is on this machine: these faults are for the local cluster of ``streamproof infra up``.

Example (what a PostgreSQL write of 4 partitions carries when ``executor-mid-write`` is armed for batch 3)::

    >>> fault = task_fault("executor-mid-write", partitions=4, batch_id=3)
    >>> fault.partition_id, fault.marker
    (3, 'executor-mid-write@3')
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamproof.faults.points import (
    DATANODE_RESTART,
    EXECUTOR_MID_WRITE,
    MID_SINK_WRITE,
    SPECULATION,
    WORKER_LOSS,
    ancestor_running,
    kill_from_task,
    kill_process_tree,
    pausing,
)

FAULT_DIR_ENV = "STREAMPROOF_FAULT_DIR"
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
WORKER_MAIN = "org.apache.spark.deploy.worker.Worker"
SPECULATION_HOLD_S = 8.0  # how long the first attempt waits: Spark's speculation launches a copy well before
HARNESS_WAIT_S = 60.0  # how long a held task waits for the harness to break the DataNode
RELEASED = ".released"  # the harness's answer to a held task: write on


def fault_folder() -> str:
    """Where the marker files of this run's faults go (the harness's folder, else one per driver process)."""
    return os.environ.get(FAULT_DIR_ENV) or str(Path(tempfile.gettempdir()) / f"streamproof-faults-{os.getpid()}")


def fires_once(folder: str, marker: str) -> bool:
    """True for the first caller only, across processes: creates ``folder/marker`` exclusively."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(Path(folder) / marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _first_attempt() -> bool:
    from pyspark import TaskContext  # in a task: the worker's pyspark, imported where the task runs

    context = TaskContext.get()
    return context is not None and context.attemptNumber() == 0


def _fires_here(partition_id: int, chosen: int, folder: str, marker: str) -> bool:
    """Whether a fault of the machines fires in this task: the chosen partition's first attempt, once per batch."""
    return partition_id == chosen and _first_attempt() and fires_once(folder, marker)


@dataclass(frozen=True)
class CrashInTask:
    """The ``mid-sink-write`` crash of a sink that writes from Python tasks: the batch's last partition
    kills the pipeline's process tree when its write reaches the point, by which time the other
    partitions may have committed: the hardest case for a per-partition commit.

    >>> task_fault(None, partitions=4) is None
    True
    """

    driver_pid: int
    partition_id: int
    pause: bool = False  # ``$STREAMPROOF_CRASH_ACTION=pause``: SIGSTOP the tree instead; the write goes on if continued

    def reached(self, partition_id: int) -> None:
        """Called by each task at its mid-write point; the chosen one kills (or stops) the driver's whole tree."""
        if partition_id != self.partition_id:
            return
        if self.pause:
            print(f"[streamproof] crash point {MID_SINK_WRITE} reached in a write task: SIGSTOP", file=sys.stderr,
                  flush=True)  # fmt: skip
            kill_process_tree(self.driver_pid, signal.SIGSTOP)
            return
        kill_from_task(self.driver_pid)


@dataclass(frozen=True)
class SlowFirstAttempt:
    """The ``speculation`` fault: the first attempt of the chosen partition waits at its mid-write point (written,
    not committed), so that Spark's speculation starts a second attempt on another executor, which runs while the
    first is still alive. Both reach the sink: the keyed commit must take exactly one."""

    partition_id: int
    seconds: float = SPECULATION_HOLD_S

    def reached(self, partition_id: int) -> None:
        if partition_id == self.partition_id and _first_attempt():
            print(
                f"[streamproof] first attempt of write task {partition_id} held for {self.seconds:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(self.seconds)


@dataclass(frozen=True)
class MachineLoss:
    """``executor-mid-write`` (the executor JVM running the task) or ``worker-loss`` (the Worker daemon above it,
    with all its executors): SIGKILLed from the task, halfway through its write."""

    point: str
    partition_id: int
    marker: str
    folder: str = field(default_factory=fault_folder)

    def reached(self, partition_id: int) -> None:
        if not _fires_here(partition_id, self.partition_id, self.folder, self.marker):
            return
        main = EXECUTOR_MAIN if self.point == EXECUTOR_MID_WRITE else WORKER_MAIN
        victim = ancestor_running(main)
        if victim is None:
            return  # not on a standalone cluster's executor (local mode): nothing of the kind to lose
        print(
            f"[streamproof] {self.point}: SIGKILL {main.rsplit('.', 1)[1]} {victim} from write task {partition_id}",
            file=sys.stderr,
            flush=True,
        )
        if self.point == EXECUTOR_MID_WRITE:
            os.kill(victim, signal.SIGKILL)  # the JVM alone: its Worker (same process group) lives on
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgrp(), signal.SIGKILL)  # PySpark's workers of that executor, this one included
        else:
            kill_process_tree(victim)  # the Worker, its executors and their PySpark workers
        time.sleep(60)  # unreachable in practice


@dataclass(frozen=True)
class HeldForTheHarness:
    """``datanode-restart``: the task stops halfway through its write, announces it (its marker file) and waits
    until the harness, having SIGKILLed the DataNode, releases it; it then writes on into the dead DataNode."""

    partition_id: int
    marker: str
    folder: str = field(default_factory=fault_folder)
    seconds: float = HARNESS_WAIT_S

    def reached(self, partition_id: int) -> None:
        if not _fires_here(partition_id, self.partition_id, self.folder, self.marker):
            return
        released = Path(self.folder) / (self.marker + RELEASED)
        deadline = time.monotonic() + self.seconds
        while not released.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


TaskFault = CrashInTask | SlowFirstAttempt | MachineLoss | HeldForTheHarness


def task_fault(point: str | None, partitions: int, batch_id: int = 0) -> TaskFault | None:
    """What the write of batch ``batch_id``, in ``partitions`` tasks, does at its mid-write point for the fault
    ``point`` the batch carries (None: nothing). Built in the driver, shipped to the tasks."""
    last = partitions - 1
    if point == MID_SINK_WRITE:
        return CrashInTask(os.getpid(), last, pausing())
    if point == SPECULATION:
        return SlowFirstAttempt(last)
    if point in (EXECUTOR_MID_WRITE, WORKER_LOSS):
        return MachineLoss(point, last, f"{point}@{batch_id}")
    if point == DATANODE_RESTART:
        return HeldForTheHarness(last, f"{point}@{batch_id}")
    return None


def held_back(rows: Any, point: str | None, batch_id: int = 0) -> Any:
    """``rows`` with a Python stage in front of a JVM writer (Delta, Parquet) whose tasks meet the fault ``point``
    halfway through their rows; ``rows`` itself when no fault of a task is armed (``mid-sink-write`` of a JVM
    writer is a kill of the driver, watched from the driver)."""
    if point is None or point == MID_SINK_WRITE:
        return rows
    fault = task_fault(point, rows.rdd.getNumPartitions(), batch_id)

    def meet(index: int, partition: Iterator[Any]) -> Iterator[Any]:
        assert fault is not None
        rows_of_task = list(partition)
        half = len(rows_of_task) // 2
        yield from rows_of_task[:half]  # the writer has them: its files are open, nothing is committed
        fault.reached(index)
        yield from rows_of_task[half:]

    return rows.sparkSession.createDataFrame(rows.rdd.mapPartitionsWithIndex(meet), rows.schema)
