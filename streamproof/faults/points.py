"""Named crash points of a micro-batch, and the SIGKILL that realises them.

A crash is a SIGKILL of the pipeline's whole process tree (the Python driver, the Spark JVM it started,
and PySpark's Python workers, which PySpark puts in a process group of their own), never a Python
exception: nothing gets to clean up, flush or roll back, exactly like a power cut. The harness
(:mod:`streamproof.harness`) arms a point for a batch through the environment variable
``STREAMPROOF_CRASH_AT`` (``"<point>@<batch_id>"``) of the child it starts; sinks call :func:`reached`
at each phase and the process dies there if armed.

Points (DESIGN.md):

* ``before-sink-write``: the offset log holds the batch, nothing of it is written;
* ``mid-sink-write``: while the sink's write job runs (data files partly written, no commit); in a
  fan-out, ``mid-sink-write:<sink label>`` picks the sink (default: the first). In your own sink (``kind =
  "python"``) it is a moment of your write, found while it runs (:mod:`streamproof.your_code.steps`):
  ``mid-sink-write#k`` (``mid-sink-write:<label>#k``) crashes after its k-th durable step (default: the first);
* ``after-sink-commit``: the sink transaction is durable, Spark's ``commits/<batch>`` is not written;
* ``after-checkpoint-commit``: Spark wrote ``commits/<batch>``, and the next batch has written nothing;
* ``random``: killed from outside at a uniformly random moment (the harness does it; no hook).

On a cluster (``[spark] master = "spark://..."``, and HDFS for the DataNode), faults of the machines rather than
of the driver, met inside the write's tasks (:mod:`streamproof.faults.in_tasks`, once per batch, first attempt only);
the run is expected to survive them, exactly-once, and several may be armed for one run, a batch each
(``STREAMPROOF_CRASH_AT=executor-mid-write@2,worker-loss@3``):

* ``executor-mid-write``: the executor JVM running the write's last task is SIGKILLed halfway through the task's
  rows; Spark retries the task on another executor;
* ``worker-loss``: likewise the Worker daemon above that executor, with all its executors (the harness starts the
  Worker again once the batch is committed);
* ``datanode-restart``: the task stops halfway and waits while the harness SIGKILLs the DataNode, then writes on
  into the dead DataNode; the harness starts it again a second later;
* ``speculation``: the first attempt of the write's last task is held back after writing and before committing,
  so that Spark's speculation runs a second attempt of it on another executor.

Example::

    $ STREAMPROOF_CRASH_AT=after-sink-commit@3 setsid streamproof run orders.toml --available-now
    # dies by SIGKILL right after batch 3 is committed to the sink
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamproof.errors import ConfigError

CRASH_ENV = "STREAMPROOF_CRASH_AT"
# "pause": a point of the driver (not of a task or a machine) SIGSTOPs the run's process tree instead of killing it
# (tests/test_lease.py: a driver paused inside a sink write, taken over, then continued).
ACTION_ENV = "STREAMPROOF_CRASH_ACTION"
PAUSE = "pause"
BEFORE_SINK_WRITE = "before-sink-write"
MID_SINK_WRITE = "mid-sink-write"
AFTER_SINK_COMMIT = "after-sink-commit"
AFTER_CHECKPOINT_COMMIT = "after-checkpoint-commit"
RANDOM = "random"
NAMED_POINTS = (BEFORE_SINK_WRITE, MID_SINK_WRITE, AFTER_SINK_COMMIT, AFTER_CHECKPOINT_COMMIT)
EXECUTOR_MID_WRITE = "executor-mid-write"
WORKER_LOSS = "worker-loss"
DATANODE_RESTART = "datanode-restart"
SPECULATION = "speculation"
CLUSTER_POINTS = (EXECUTOR_MID_WRITE, WORKER_LOSS, DATANODE_RESTART, SPECULATION)
WRITE_POINTS = (MID_SINK_WRITE, *CLUSTER_POINTS)  # points inside one sink's write; a sink label may pick it
POINTS = (*NAMED_POINTS, *CLUSTER_POINTS)


@dataclass(frozen=True)
class ArmedCrash:
    point: str
    batch_id: int
    sink: str | None = None  # mid-sink-write only: the label of the sink whose write is killed
    moment: int | None = None  # mid-sink-write in your own sink: after its k-th durable step (None: the first)

    def encode(self) -> str:
        moment = f"#{self.moment}" if self.moment is not None else ""
        return f"{self.point}{':' + self.sink if self.sink else ''}{moment}@{self.batch_id}"


def split_moment(text: str) -> tuple[str, int | None]:
    """``"mid-sink-write:ledger#2"`` -> ``("mid-sink-write:ledger", 2)``: the moment of your write a crash is armed at.

    >>> split_moment("mid-sink-write#3"), split_moment("after-sink-commit")
    (('mid-sink-write', 3), ('after-sink-commit', None))
    >>> split_moment("after-sink-commit#2")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: crash point 'after-sink-commit#2': only mid-sink-write has moments (#k, k >= 1: ...
    """
    where, mark, moment = text.partition("#")
    if not mark:
        return text, None
    if where.partition(":")[0] != MID_SINK_WRITE or not moment.isdigit() or int(moment) < 1:
        raise ConfigError(
            f"crash point {text!r}: only {MID_SINK_WRITE} has moments (#k, k >= 1: after the k-th "
            "durable step of your write)"
        )
    return where, int(moment)


def split_point(text: str) -> tuple[str, str | None]:
    """``"mid-sink-write:kafka"`` -> ``("mid-sink-write", "kafka")``; a sink may be named for the points of a write.

    >>> split_point("after-sink-commit"), split_point("speculation:pg"), split_point("mid-sink-write:ledger#2")
    (('after-sink-commit', None), ('speculation', 'pg'), ('mid-sink-write', 'ledger'))
    """
    point, _, sink = split_moment(text)[0].partition(":")
    if point not in POINTS or (sink and point not in WRITE_POINTS):
        raise ConfigError(
            f"crash point {text!r}: expected one of {', '.join(POINTS)} (or <point of a write>:<sink label>)"
        )
    return point, sink or None


def parse_crash(text: str) -> ArmedCrash:
    """``"after-sink-commit@3"`` -> ``ArmedCrash("after-sink-commit", 3)``.

    >>> parse_crash("mid-sink-write:postgres@2")
    ArmedCrash(point='mid-sink-write', batch_id=2, sink='postgres', moment=None)
    >>> parse_crash("mid-sink-write:ledger#2@3").encode()
    'mid-sink-write:ledger#2@3'
    """
    where, _, batch = text.partition("@")
    if not batch.isdigit():
        raise ConfigError(f"{CRASH_ENV}={text!r}: expected <point>@<batch id>, e.g. after-sink-commit@1")
    try:
        point, sink = split_point(where)
        moment = split_moment(where)[1]
    except ConfigError as error:
        raise ConfigError(f"{CRASH_ENV}={text!r}: {error}") from None
    return ArmedCrash(point, int(batch), sink, moment)


def parse_crashes(text: str) -> list[ArmedCrash]:
    """Several points, comma-separated: at most one crash of the driver (it ends the run), and faults of the
    machines the run survives, one per batch.

    >>> [crash.encode() for crash in parse_crashes("executor-mid-write@2,worker-loss@3")]
    ['executor-mid-write@2', 'worker-loss@3']
    """
    crashes = [parse_crash(part.strip()) for part in text.split(",") if part.strip()]
    driver = [crash for crash in crashes if crash.point not in CLUSTER_POINTS]
    batches = [crash.batch_id for crash in crashes]
    if len(driver) > 1 or len(set(batches)) < len(batches):
        raise ConfigError(f"{CRASH_ENV}={text!r}: one crash of the driver per run and one point per batch")
    return crashes


def armed_crashes() -> list[ArmedCrash]:
    """The crashes armed for this process, if any. Arming requires leading a process group."""
    text = os.environ.get(CRASH_ENV)
    if not text:
        return []
    crashes = parse_crashes(text)
    if os.getpgrp() != os.getpid():
        # Killing a group we do not lead could take the user's shell with it.
        raise ConfigError(
            f"{CRASH_ENV} is set but this process does not lead its process group: "
            "run crash tests through `streamproof prove` (it starts the pipeline with setsid)"
        )
    return crashes


@dataclass(frozen=True)
class ProcessInfo:
    """One process as ``/proc/<pid>/stat`` shows it: the one reader of that file (the run lock, the standby, the
    harness and infra ask here).

    >>> me = process_info(os.getpid())
    >>> me.state in ("R", "S", "D"), me.alive, process_info(-1)
    (True, True, None)
    """

    pid: int
    parent: int
    group: int
    state: str  # "Z": exited, waiting to be reaped
    start_ticks: int  # when it started, in clock ticks after boot: with the pid, one process (pids are reused)

    @property
    def alive(self) -> bool:
        """Running: an exited process its parent has not reaped yet (a zombie) counts as gone."""
        return self.state != "Z"


def _parsed(pid: int, text: str) -> ProcessInfo:
    # The command name (field 2) is in parentheses and may hold spaces or ")": the fields after the last ") " count.
    fields = text.rsplit(") ", 1)[1].split()
    return ProcessInfo(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]))


def process_info(pid: int) -> ProcessInfo | None:
    """``pid`` as ``/proc/<pid>/stat`` shows it; None when there is no such process."""
    try:
        return _parsed(pid, Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return None


def process_table() -> dict[int, ProcessInfo]:
    """Every process of the machine, by pid: one scan of ``/proc`` (a process that exits meanwhile is skipped)."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            info = _parsed(int(stat.parent.name), stat.read_text())
        except (OSError, IndexError, ValueError):
            continue
        table[info.pid] = info
    return table


def process_cmdline(pid: int) -> str:
    """The command line of ``pid``, words joined by spaces; "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ancestor_running(main_class: str, pid: int | None = None) -> int | None:
    """The nearest ancestor of ``pid`` (default: this process) whose command line runs ``main_class``, e.g. the
    executor JVM above a PySpark worker; None when there is none."""
    table = process_table()
    current = table.get(pid or os.getpid())
    while current is not None and current.parent > 1:
        current = table.get(current.parent)
        if current is not None and main_class in process_cmdline(current.pid).split():
            return current.pid
    return None


def process_tree_groups(root: int) -> list[int]:
    """Process groups of ``root`` and of all its descendants, ``root``'s own group last.

    PySpark's daemon (a child of the JVM) leads a group of its own with the Python workers in it, so
    killing the driver's group alone would leave workers running, able to finish a write after the crash.
    """
    table = process_table()
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [info.pid for info in table.values() if info.parent == parent and info.pid not in tree]
        tree.update(children)
        frontier.extend(children)
    own = table[root].group if root in table else root
    return sorted({table[pid].group for pid in tree if pid in table} - {own}) + [own]


def surviving_processes(process_groups: list[int]) -> list[int]:
    """Pids of live processes still in any of the given process groups (expected after a kill: none)."""
    groups = set(process_groups)
    return [info.pid for info in process_table().values() if info.state != "Z" and info.group in groups]


def kill_process_tree(root: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """SIGKILL (or ``sig``) every process group of ``root``'s tree (see :func:`process_tree_groups`); the caller's own
    group last, since the caller may be in the tree (a driver, or a PySpark worker) and dies with it."""
    groups = process_tree_groups(root)
    own = os.getpgrp()
    for group in [g for g in groups if g != own] + [g for g in groups if g == own]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sig)


def kill_own_process_group() -> None:
    """SIGKILL this process's tree: the Python driver, its Spark JVM and the Python workers die together, now."""
    kill_process_tree(os.getpid())
    time.sleep(60)  # unreachable in practice: the signal is delivered before the next bytecode


def kill_from_task(driver_pid: int) -> None:
    """For a write running in a PySpark worker: kill the driver's whole tree (this worker included)."""
    print(f"[streamproof] crash point {MID_SINK_WRITE} reached in a write task: SIGKILL", file=sys.stderr, flush=True)
    kill_process_tree(driver_pid)
    time.sleep(60)


def reached(point: str, batch_id: int) -> None:
    """Hook a sink calls at each phase; kills the process group if this point is armed for this batch (with
    ``$STREAMPROOF_CRASH_ACTION=pause``: stops it, once, and goes on where it stopped when it is continued)."""
    global _ARMED
    crash = _ARMED
    if crash is not None and crash.point == point and crash.batch_id == batch_id:
        if pausing():
            _ARMED = None  # a watcher that sees the point again after the pause passes on
            print(f"[streamproof] crash point {point} reached in batch {batch_id}: SIGSTOP", flush=True)
            pause_own_process_tree()
            return
        print(f"[streamproof] crash point {point} reached in batch {batch_id}: SIGKILL", flush=True)
        kill_own_process_group()


def pausing() -> bool:
    """Whether an armed point of the driver pauses the run instead of killing it (``$STREAMPROOF_CRASH_ACTION=pause``).

    >>> pausing()
    False
    """
    return os.environ.get(ACTION_ENV) == PAUSE


def pause_own_process_tree() -> None:
    """SIGSTOP this process's tree (the driver, its Spark JVM, its Python workers), its own group last: the whole
    driver frozen at once, as a long GC pause, a VM frozen by its host or a laptop's lid does; SIGCONT resumes it."""
    kill_process_tree(os.getpid(), signal.SIGSTOP)


def mid_write_armed(batch_id: int, sink: str, *, first_sink: bool) -> str | None:
    """The point of a write (``mid-sink-write`` or a fault of the machines) armed for this batch and sink, if any
    (a point without a sink means the first)."""
    for crash in (_ARMED, _MACHINE_FAULTS.get(batch_id)):
        if crash is None or crash.point not in WRITE_POINTS or crash.batch_id != batch_id:
            continue
        if crash.sink == sink or (crash.sink is None and first_sink):
            return crash.point
    return None


def armed_moment() -> int:
    """The moment of your write ``mid-sink-write`` is armed at (``#k``; the first when none is named): asked by your
    sink once :func:`mid_write_armed` said the point is armed for it."""
    return (_ARMED.moment if _ARMED is not None else None) or 1


@contextlib.contextmanager
def sink_write(
    batch_id: int, spark_context: Any, sink: str, *, first_sink: bool, in_tasks: bool, files_in: Path | None = None
) -> Iterator[None]:
    """Wrap one sink's write of a batch: its Spark jobs run in their own job group (``streamproof-<batch>-<sink>``).

    When ``mid-sink-write`` is armed for it, the kill lands inside this write and nowhere else:

    * a sink writing data files into a folder (``files_in``: Delta, Parquet) is killed the moment the first
      new data file of the write appears there: files partly written, nothing committed;
    * a sink writing from Python tasks (``in_tasks``: PostgreSQL, Kafka) is killed by its task, at a fixed
      point of its write (:func:`kill_from_task`);
    * otherwise a watcher kills while a job of the write's group has tasks running.

    A watcher stops when the write returns: a write it could not catch is a missed crash, which the
    harness reports, never a kill that lands elsewhere.
    """
    group = f"streamproof-{batch_id}-{sink}"
    spark_context.setJobGroup(group, f"streamproof: batch {batch_id} -> {sink}")
    done = threading.Event()
    if mid_write_armed(batch_id, sink, first_sink=first_sink) == MID_SINK_WRITE and not in_tasks:
        if files_in is not None:
            watch = functools.partial(_kill_when_new_file_appears, files_in, data_files(files_in), batch_id, done)
        else:
            watch = functools.partial(_kill_while_group_runs, spark_context, group, batch_id, done)
        threading.Thread(target=watch, name="streamproof-mid-write-crash", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            spark_context.setLocalProperty(key, None)


def data_files(folder: Path | str) -> set[str]:
    """The data files under ``folder``, those of a partitioned table's ``column=value`` folders included."""
    found: set[str] = set()
    try:
        for entry in os.scandir(folder):
            if entry.name.endswith(".parquet"):
                found.add(entry.path)
            elif "=" in entry.name and entry.is_dir():
                found |= data_files(entry.path)
    except FileNotFoundError:
        pass
    return found


def _kill_when_new_file_appears(folder: Path, before: set[str], batch_id: int, done: threading.Event) -> None:
    while not done.is_set():
        if data_files(folder) - before and not done.is_set():
            reached(MID_SINK_WRITE, batch_id)
        time.sleep(0.001)


def _kill_while_group_runs(spark_context: Any, group: str, batch_id: int, done: threading.Event) -> None:
    tracker = spark_context.statusTracker()
    while not done.is_set():
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                # Let the tasks open their output files first: the kill must leave a write half done.
                if stage is not None and stage.numActiveTasks > 0 and not done.wait(0.05):
                    reached(MID_SINK_WRITE, batch_id)
        time.sleep(0.002)


def kill_when_batch_committed(batch_id: int, committed: Callable[[], bool]) -> threading.Thread | None:
    """For ``after-checkpoint-commit``: kill the group as soon as ``committed()`` says Spark's ``commits/<batch>``
    file exists.

    Spark writes it right after ``foreachBatch`` returns; the watcher polls every 2 ms, and
    :func:`batch_starting` backs it up, so the kill always lands before the next batch writes anything.
    """
    crash = _ARMED
    if crash is None or crash.point != AFTER_CHECKPOINT_COMMIT or crash.batch_id != batch_id:
        return None

    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if committed():
                reached(AFTER_CHECKPOINT_COMMIT, batch_id)
            time.sleep(0.002)

    thread = threading.Thread(target=watch, name="streamproof-after-commit-crash", daemon=True)
    thread.start()
    return thread


def batch_starting(batch_id: int) -> None:
    """First thing a sink does in a batch: a pending ``after-checkpoint-commit`` of an earlier batch fires
    here at the latest, before this batch marks progress or writes."""
    crash = _ARMED
    if crash is not None and crash.point == AFTER_CHECKPOINT_COMMIT and crash.batch_id < batch_id:
        reached(AFTER_CHECKPOINT_COMMIT, crash.batch_id)


_ARMED: ArmedCrash | None = None  # the crash of the driver
_MACHINE_FAULTS: dict[int, ArmedCrash] = {}  # by batch id: faults of the machines, met inside write tasks


@contextlib.contextmanager
def disarmed() -> Iterator[None]:
    """No crash fires inside (a standby's warm-up runs batches of its own, whose ids mean nothing to the crashes
    armed for the pipeline's batches); what was armed is armed again after.

    >>> with disarmed():
    ...     reached(BEFORE_SINK_WRITE, 0)   # nothing armed fires here
    """
    global _ARMED
    armed, machine = _ARMED, dict(_MACHINE_FAULTS)
    _ARMED = None
    _MACHINE_FAULTS.clear()
    try:
        yield
    finally:
        _ARMED = armed
        _MACHINE_FAULTS.update(machine)


def arm_from_environment() -> list[ArmedCrash]:
    """Read ``STREAMPROOF_CRASH_AT`` once, at pipeline start."""
    global _ARMED
    crashes = armed_crashes()
    _ARMED = next((crash for crash in crashes if crash.point not in CLUSTER_POINTS), None)
    _MACHINE_FAULTS.clear()
    _MACHINE_FAULTS.update({crash.batch_id: crash for crash in crashes if crash.point in CLUSTER_POINTS})
    return crashes
