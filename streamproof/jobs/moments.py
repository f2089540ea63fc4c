"""The moments of a job's batch a proof crashes at, armed in the run, and the SIGKILL that takes them.

Spark's own sinks write in the JVM, where no Python runs during the write; their moments are the checkpoint's own
entries, which streamproof's checkpoint manager (``jvm/s3``'s ``MomentCheckpointFileManager``, set for every job
run) stops at when armed, until the driver's Python, watching, SIGKILLs the whole process tree:

* ``before-sink-write``: ``offsets/<b>`` written (the batch is logged), before the sink is handed anything;
* ``mid-sink-write``: a file sink (Parquet, JSON, ...) is stopped once its files are written, before its commit
  (``_spark_metadata/<b>``); a Delta table is killed at the first data file of the batch (no commit yet); Spark's Kafka
  sink while a task of its write runs; your ``foreachBatch`` function or ``ForeachWriter`` after each durable step it
  takes (``mid-sink-write#k``, :mod:`streamproof.your_code.steps`, no marker needed);
* ``after-sink-commit``: Spark is about to write ``commits/<b>``: the sink's write returned (committed), the
  checkpoint not;
* ``after-checkpoint-commit``: ``commits/<b>`` written.

Before each kill the landing is written where the harness reads it (:func:`streamproof.your_code.steps.record_landing`):
a crash without a landing did not happen where it was armed, and the proof says so (missed), never "clean".

Example::

    >>> entries("before-sink-write", 1, "/ck", sink="delta", location="/t")
    ['block:after:/ck/offsets/1']
    >>> entries("mid-sink-write", 1, "/ck", sink="parquet", location="/out")
    ['block:before:/out/_spark_metadata/1']
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamproof.faults import points as faults
from streamproof.faults.in_tasks import EXECUTOR_MAIN, fault_folder, fires_once
from streamproof.faults.points import data_files
from streamproof.jobs.inside import is_file_format, local_folder
from streamproof.jobs.record import QueryRecord
from streamproof.your_code.steps import record_landing

ARMED_PROPERTY = "streamproof.moments.armed"
MARKERS_PROPERTY = "streamproof.moments.markers"
MANAGER_CLASS = "dev.streamproof.proof.MomentCheckpointFileManager"
MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
YOUR_SINKS = ("foreachBatch", "foreach")
CRASH_QUERY_ENV = "STREAMPROOF_CRASH_QUERY"  # the query a crash is armed in (a queryName or "query <n>")


def _log_entry(root: str, log: str, batch_id: int) -> str:
    return f"{root.rstrip('/')}/{log}/{batch_id}"


def entries(point: str, batch_id: int, checkpoint: str, *, sink: str, location: str | None) -> list[str]:
    """The checkpoint manager's armed entries (``action:phase:path``) for ``point`` in ``batch_id`` of a query whose
    checkpoint is ``checkpoint`` and whose sink is ``sink`` (at ``location``); none where Python takes the moment."""
    offsets, commits = _log_entry(checkpoint, "offsets", batch_id), _log_entry(checkpoint, "commits", batch_id)
    if point == faults.BEFORE_SINK_WRITE:
        return [f"block:after:{offsets}"]
    if point == faults.AFTER_SINK_COMMIT:
        return [f"block:before:{commits}"]
    if point == faults.AFTER_CHECKPOINT_COMMIT:
        return [f"block:after:{commits}"]
    if point == faults.MID_SINK_WRITE and sink not in YOUR_SINKS:
        if is_file_format(sink) and location is not None:
            return [f"block:before:{_log_entry(location, '_spark_metadata', batch_id)}"]
        return [
            f"signal:after:{offsets}"
        ]  # then Python watches the write (a Delta table's files, a Kafka write's tasks)
    return []


WHAT = {
    faults.BEFORE_SINK_WRITE: "offsets/{b} written, nothing handed to the sink",
    faults.MID_SINK_WRITE: "the files of batch {b} written, the sink's commit (_spark_metadata/{b}) not",
    faults.AFTER_SINK_COMMIT: "the sink's write of batch {b} returned, Spark's commits/{b} not written",
    faults.AFTER_CHECKPOINT_COMMIT: "Spark's commits/{b} written",
}


class Moments:
    """The crash armed for this run of the job (``STREAMPROOF_CRASH_AT``), taken at its moment: see the module.

    ``target`` is the query it is armed in (``STREAMPROOF_CRASH_QUERY``: a queryName or ``query <n>``; the first
    query the job starts when unset).
    """

    def __init__(self, spark: Any, fault_dir: str, target: str | None = None) -> None:
        self.spark = spark
        self.fault_dir = fault_dir
        self.markers = Path(fault_dir) / "moments"
        self.armed = faults._ARMED
        self.target = target
        self.query: QueryRecord | None = None
        self._entries: list[str] = []
        self._watching = False

    def for_query(self, query: QueryRecord) -> bool:
        """Whether the armed crash is in ``query`` (the first one started, unless a query is named)."""
        if self.armed is None:
            return False
        if self.target is not None:
            return query.label == self.target
        return self.query is None or self.query is query

    def arm(self, query: QueryRecord) -> None:
        """Arm the checkpoint manager for ``query``, before it starts."""
        if not self.for_query(query) or query.checkpoint is None:
            return
        assert self.armed is not None
        self.query = query
        self._entries = entries(
            self.armed.point, self.armed.batch_id, query.checkpoint, sink=query.sink, location=query.location
        )
        if not self._entries:
            return
        system = self.spark._jvm.java.lang.System
        system.setProperty(MARKERS_PROPERTY, str(self.markers))
        system.setProperty(ARMED_PROPERTY, ",".join(self._entries))
        if not self._watching:
            self._watching = True
            threading.Thread(target=self._watch, name="streamproof-moments", daemon=True).start()

    def _watch(self) -> None:
        """Polls for the marker of each armed entry (``reached-<n>``, one stat each: the batch's thread is stopped
        while it waits, so a few milliseconds change nothing but the CPU the watch costs)."""
        waiting = {index: self.markers / f"reached-{index + 1}" for index in range(len(self._entries))}
        deadline = time.monotonic() + 3600
        while waiting and time.monotonic() < deadline:
            for index, marker in list(waiting.items()):
                if not marker.exists():
                    continue
                del waiting[index]
                if self._entries[index].startswith("block:") and self.armed is not None:
                    what = WHAT.get(self.armed.point, "at its moment").format(b=self.armed.batch_id)
                    self.kill(what, "checkpoint")
                else:
                    self._watch_write()
            time.sleep(0.005)

    def _watch_write(self) -> None:
        """``mid-sink-write`` in Spark's own sink, the batch logged: kill inside its write."""
        query = self.query
        assert query is not None and self.armed is not None
        folder = local_folder(query.location) if query.location else None
        if query.sink == "delta" and folder is not None:
            before = data_files(folder)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                new = data_files(folder) - before
                if new:
                    self.kill(
                        f"the first data file of batch {self.armed.batch_id} written ({Path(min(new)).name}), "
                        "not committed",
                        "sink",
                    )
                time.sleep(0.001)
            return
        tracker = self.spark.sparkContext.statusTracker()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            for job_id in tracker.getJobIdsForGroup(query.run_id) if query.run_id else tracker.getActiveJobsIds():
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job is not None else ():
                    stage = tracker.getStageInfo(stage_id)
                    if stage is not None and stage.numActiveTasks > 0:
                        time.sleep(0.02)  # let the tasks send some of their records first
                        self.kill(f"a task of batch {self.armed.batch_id}'s write running", "sink")
            time.sleep(0.002)

    def kill(self, what: str, where: str) -> None:
        """The landing first (the harness's evidence), then SIGKILL of the whole process tree."""
        assert self.armed is not None and self.query is not None
        record_landing(self.fault_dir, self.armed.batch_id, self.query.label, 0, what, where)
        print(
            f"[streamproof] {self.armed.point} of {self.query.label} in batch {self.armed.batch_id}: {what}: SIGKILL",
            file=sys.stderr,
            flush=True,
        )
        faults.kill_own_process_group()

    def moment_in_your_write(self, query: QueryRecord, batch_id: int) -> int | None:
        """The moment of your write (``mid-sink-write#k``) armed for this batch of ``query``, if one is."""
        armed = self.armed
        if armed is None or armed.point != faults.MID_SINK_WRITE or armed.batch_id != batch_id:
            return None
        if not self.for_query(query):
            return None
        self.query = query
        return armed.moment or 1


def executors_of(application: str) -> dict[int, int]:
    """The executor JVMs of ``application`` on this machine, by executor id: their pids (``/proc``'s command lines).

    >>> executors_of("app-none")
    {}
    """
    found = {}
    for pid in faults.process_table():
        words = faults.process_cmdline(pid).split()
        if EXECUTOR_MAIN in words and application in words and "--executor-id" in words:
            found[int(words[words.index("--executor-id") + 1])] = pid
    return found


HOLD_CLASS = "dev.streamproof.proof.HoldingLocalFileSystem"
HOLD_FOLDER = "streamproof.hold.folder"


def holding_conf(jars: list[Path], folder: str) -> dict[str, str]:
    """The settings of a job's run on a cluster that let :func:`kill_an_executor_mid_write` hold a write task with
    its first data file open (``jvm/s3``'s ``HoldingLocalFileSystem`` in place of Hadoop's local file system, on the
    JVMs' own class path: spark-submit and an executor load it before any ``spark.jars`` is theirs).

    >>> conf = holding_conf([Path("/cache/delta-spark.jar"), Path("/cache/streamproof-s3-1.jar")], "/tmp/faults")
    >>> conf["spark.executor.extraClassPath"], conf["spark.hadoop.streamproof.hold.folder"]
    ('/cache/streamproof-s3-1.jar', '/tmp/faults')
    """
    own = [str(jar) for jar in jars if jar.name.startswith("streamproof-")]
    return {
        "spark.hadoop.fs.file.impl": HOLD_CLASS,
        f"spark.hadoop.{HOLD_FOLDER}": folder,
        "spark.executor.extraClassPath": ":".join(own),
        "spark.driver.extraClassPath": ":".join(own),
    }


def kill_an_executor_mid_write(spark: Any, group: str, batch_id: int, label: str, done: threading.Event) -> None:
    """``executor-mid-write`` in a job on a cluster: the write's first task (job group ``group``) to open a data
    file is held there by the executor's file system (:func:`holding_conf`), which names its JVM; SIGKILL that JVM
    from the driver (the job's own tasks run JVM code only). Spark retries the task on another executor and the run
    goes on. Once per batch (a marker in the fault folder); what was killed is recorded as the fault's landing, and
    Spark's event log is the evidence (an attempt lost with its executor). A write that opens no local data file
    (another file system) is never held: the cell's evidence then says the fault did not happen."""
    folder = Path(fault_folder())
    folder.mkdir(parents=True, exist_ok=True)
    if not fires_once(str(folder), f"{faults.EXECUTOR_MID_WRITE}@{batch_id}"):
        return
    armed, held = folder / f"hold-{group}", folder / f"held-{group}"
    armed.touch()
    try:
        pid = _held_executor(held, done)
        if pid is None:
            return
        executors = executors_of(spark.sparkContext.applicationId)  # read while it lives: the task holds
        executor = next((number for number, known in executors.items() if known == pid), "?")
        os.kill(pid, signal.SIGKILL)
        what = f"executor {executor} (pid {pid}) SIGKILLed, its task of batch {batch_id}'s write holding a file open"
        record_landing(str(folder), batch_id, label, 0, what, f"executor {executor}")
        print(f"[streamproof] {faults.EXECUTOR_MID_WRITE} in batch {batch_id}: {what}", file=sys.stderr, flush=True)
    finally:
        armed.unlink(missing_ok=True)


def _held_executor(held: Path, done: threading.Event) -> int | None:
    """The pid the held task wrote into ``held`` (None when the write ended without one)."""
    deadline = time.monotonic() + 600
    while not done.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(held.read_text())  # the file exists before its pid is in it: read again until it is
        time.sleep(0.005)
    return None


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def clear_markers(fault_dir: str) -> None:
    """A run's markers start empty (a folder reused by the next run of a cell)."""
    folder = Path(fault_dir) / "moments"
    for marker in folder.glob("*") if folder.exists() else []:
        with contextlib.suppress(OSError):
            os.remove(marker)
