"""The durable steps your own write takes, found while it runs: the moments a proof crashes your code at, with no
marker in it.

Your ``foreachBatch`` function (``[sink] kind = "python"``) is code streamproof did not write, so where it can break
is where it makes something durable: between two of those steps a crash leaves the first done and the second not.
For the length of your call, streamproof counts each call that makes something durable and returns
(:mod:`streamproof.your_code.calls`: a Spark or Delta write, a DB-API or JDBC commit, a Kafka transaction, a job running
your code in tasks, whose tasks count their own commits), and ``this_batch().step("...")`` where you mark a moment
yourself (optional).

The moments of a write (:func:`moments`) are: after each step in the driver; and, for a job whose tasks committed,
after the j-th commit of a task (the first task to reach it: the others may or may not have committed theirs), for
the first :data:`TASK_MOMENTS` commits of a task. ``mid-sink-write#k`` (:mod:`streamproof.faults.points`) SIGKILLs the
whole run at the k-th moment; a clean batch tells how many there are. A write in which none of these is seen has no
moment: a proof says "not exercised", never "clean"; a moment the armed batch does not reach is killed when the write
returns, and says so.

Example::

    >>> steps = [Step("DataFrameWriter.save('/data/orders')"), Step("DataFrameWriter.save('/data/control')")]
    >>> for moment in moments(steps):
    ...     print(moment)
    after step 1: DataFrameWriter.save('/data/orders')
    after step 2: DataFrameWriter.save('/data/control')
    >>> for moment in moments([Step("foreachPartition", task_steps=5, task_what="psycopg commit")]):
    ...     print(moment)
    in a task of step 1 (foreachPartition), after its psycopg commit 1
    in a task of step 1 (foreachPartition), after its psycopg commit 2
    in a task of step 1 (foreachPartition), after its psycopg commit 3
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamproof.faults import points as faults
from streamproof.faults.in_tasks import fault_folder
from streamproof.your_code import calls

EVIDENCE_PREFIX = "moment-"  # <fault folder>/moment-<batch>-<sink>.json: the moment a crash landed at, for the harness
TASK_MOMENTS = 3  # the commits of a task that are moments: its first three (a task committing per row has hundreds)
MOMENTS_CRASHED = 12  # the moments of one write a proof crashes at, in turn (a write committing per row has hundreds)


@dataclass(frozen=True)
class Step:
    """One durable step of a write: what returned (``what``); for a job that ran your code in tasks, the most durable
    steps one of its tasks took (``task_steps``) and what the first of them was."""

    what: str
    task_steps: int = 0
    task_what: str = ""


def moments(steps: list[Step]) -> list[str]:
    """The moments of a write whose steps were ``steps``, in order, each as a line (module docstring)."""
    found = []
    for number, step in enumerate(steps, start=1):
        if step.task_steps:
            found += [
                f"in a task of step {number} ({step.what}), after its {step.task_what} {j}"
                for j in range(1, min(step.task_steps, TASK_MOMENTS) + 1)
            ]
        else:
            found.append(f"after step {number}: {step.what}")
    return found


@dataclass(frozen=True)
class Landing:
    """Where an armed moment is: after a step of the driver, or after the ``task_step``-th commit of a task."""

    step: int  # 1-based, the step of the write
    task_step: int | None = None


def landing(steps: list[Step], moment: int) -> Landing | None:
    """Where the ``moment``-th moment falls, given the steps taken so far; None when it lies beyond them (a later
    step decides). The step in flight counts as a task job: its tasks may reach the moment.

    >>> landing([Step("save")], 1), landing([Step("save")], 2)
    (Landing(step=1, task_step=None), None)
    >>> landing([Step("save"), Step("foreachPartition", task_steps=3)], 3)
    Landing(step=2, task_step=2)
    """
    passed = 0
    for number, step in enumerate(steps, start=1):
        width = min(step.task_steps, TASK_MOMENTS) or 1
        if moment <= passed + width:
            return Landing(number, moment - passed if step.task_steps else None)
        passed += width
    return None


class WriteSteps:
    """The steps of one write of your code, counted as they return (in the driver); the armed moment kills the run.

    >>> seen = WriteSteps(batch_id=3, sink="ledger", armed=None)
    >>> seen.took("DataFrameWriter.save('/t')"); seen.moments
    ["after step 1: DataFrameWriter.save('/t')"]
    """

    def __init__(
        self, batch_id: int, sink: str, armed: int | None, evidence: str | None = None, batch: YourBatch | None = None
    ) -> None:
        self.batch_id = batch_id
        self.batch = batch
        self.sink = sink
        self.armed = armed  # the moment to crash at (mid-sink-write#k), None: count only
        self.evidence = evidence  # the fault folder, where the landing is written before the kill
        self.steps: list[Step] = []
        self.depth = 0  # inside a counted call: what it runs is part of that step
        self.unseen: list[str] = []  # durable steps taken in another thread: no crash can land after them
        self.driver_pid = os.getpid()

    @property
    def moments(self) -> list[str]:
        return moments(self.steps)

    def took(self, what: str, task_steps: int = 0, task_what: str = "") -> None:
        """A step returned: counted, and the run is killed here when it is the armed moment."""
        self.steps.append(Step(what, task_steps, task_what))
        if self.armed is not None and not task_steps and landing(self.steps, self.armed) == Landing(len(self.steps)):
            self.crash(self.moments[self.armed - 1], "driver")

    def task_moment(self) -> int | None:
        """For the job about to run: the commit of a task at which the armed moment falls (j), if it falls there."""
        if self.armed is None:
            return None
        found = landing([*self.steps, Step("job", task_steps=TASK_MOMENTS)], self.armed)
        return found.task_step if found is not None and found.step == len(self.steps) + 1 else None

    def crash(self, moment: str, where: str, reached: bool = True) -> None:
        """SIGKILL the whole run here, its landing written first (the harness's evidence); with
        ``$STREAMPROOF_CRASH_ACTION=pause``, SIGSTOP it instead, once, and go on with your write when it is continued
        (a driver paused past its lease inside your write: ``tests/test_lease.py``)."""
        record_landing(self.evidence, self.batch_id, self.sink, self.armed or 0, moment, where, reached)
        if faults.pausing() and where == "driver":
            self.armed = None  # the moments after it pass on
            print(f"[streamproof] mid-sink-write of {self.sink} in batch {self.batch_id}, {moment}: SIGSTOP",
                  file=sys.stderr, flush=True)  # fmt: skip
            faults.pause_own_process_tree()
            return
        print(
            f"[streamproof] mid-sink-write#{self.armed} of {self.sink} in batch {self.batch_id}, {moment}: SIGKILL",
            file=sys.stderr,
            flush=True,
        )
        faults.kill_own_process_group()


def record_landing(
    folder: str | None, batch_id: int, sink: str, moment: int, what: str, where: str, reached: bool = True
) -> None:
    """Write where a crash of your write lands (before the kill): the harness's evidence that it happened there;
    ``reached`` False: the write went through fewer moments, and the crash came when it returned."""
    if folder is None:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"{EVIDENCE_PREFIX}{batch_id}-{sink}.json"
    path.write_text(json.dumps({"moment": moment, "what": what, "where": where, "reached": reached}))


def landed(folder: Path, batch_id: int, sink: str) -> dict[str, Any] | None:
    """The landing :func:`record_landing` wrote for a crash of ``sink``'s write of ``batch_id``, if one did."""
    try:
        return dict(json.loads((folder / f"{EVIDENCE_PREFIX}{batch_id}-{sink}.json").read_text()))
    except (OSError, ValueError):
        return None


Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class YourBatch:
    """What streamproof knows of the batch your write is handed, beside Spark's plain ``int`` id: :func:`this_batch`.
    Picklable: usable inside ``foreachPartition``.

    ``key`` names the batch by its source offsets (pipeline, start and end), so it survives any checkpoint: a lost,
    restored or recovered one numbers its batches again, and a ledger keyed on ``key`` still knows a replay of the
    same records (docs/your-code.md).

    >>> batch = YourBatch(7, "orders", {"orders": {"0": 10}}, {"orders": {"0": 20}})
    >>> batch.id, batch.key, batch.step("rows committed")
    (7, 'orders:fca4fa40d49fe3f2', None)
    """

    id: int
    pipeline: str
    start_offsets: Offsets | None
    end_offsets: Offsets
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        digest = hashlib.sha256(json.dumps([self.start_offsets, self.end_offsets], sort_keys=True).encode())
        return f"{self.pipeline}:{digest.hexdigest()[:16]}"

    def step(self, name: str) -> None:
        """A moment you mark yourself (optional: streamproof finds your commits without it): counted as a step of the
        write where it is reached, in the driver or in a task."""
        mark(name)


def this_batch() -> YourBatch:
    """The batch your write (or its task) is writing: its id, pipeline, offsets, key and options.

    >>> this_batch()
    Traceback (most recent call last):
    ...
    RuntimeError: this_batch() is only known inside a write streamproof hands a batch to (a python sink's write)
    """
    steps = calls.current()
    if steps is None or steps.batch is None:
        raise RuntimeError(
            "this_batch() is only known inside a write streamproof hands a batch to (a python sink's write)"
        )
    return steps.batch  # type: ignore[no-any-return]


def watch_durable_calls() -> None:
    """Make the durable calls of :mod:`streamproof.your_code.calls` countable now (rather than at the first write): a
    job run patches Spark's writers first, to map their paths, and the counting wraps those patches, so that a step
    keeps the job's own address (the same in every sandbox)."""
    calls.install(_task_job)


@contextlib.contextmanager
def counting(steps: WriteSteps | TaskSteps) -> Iterator[WriteSteps | TaskSteps]:
    """Count ``steps`` in this thread for the length of the block (your write, or one of its tasks)."""
    calls.install(_task_job)
    with calls.counting_in_this_thread(steps):
        yield steps


# --- your code in tasks -----------------------------------------------------------------------------------------------


class MostSteps:
    """An accumulator's value: the most steps one task took, and what its first was (max over the tasks)."""

    def zero(self, value: tuple[int, str]) -> tuple[int, str]:
        return (0, "")

    def addInPlace(self, mine: tuple[int, str], theirs: tuple[int, str]) -> tuple[int, str]:  # noqa: N802 - Spark's
        return max(mine, theirs)


@dataclass
class TaskSteps:
    """What a task of your write counts: its commits, the armed one (``armed``, j) killing the whole run. Built in the
    driver, shipped with the task (picklable)."""

    batch_id: int
    sink: str
    job: str
    step: int
    armed: int | None
    driver_pid: int
    evidence: str | None
    seen: Any = None  # the job's accumulator of MostSteps
    batch: YourBatch | None = None
    count: int = field(default=0, compare=False)
    first: str = field(default="", compare=False)
    depth: int = field(default=0, compare=False)

    def took(self, what: str, task_steps: int = 0, task_what: str = "") -> None:
        self.count += 1
        self.first = self.first or what
        if self.armed == self.count:
            from pyspark import TaskContext

            context = TaskContext.get()
            where = f"task {context.partitionId()}" if context is not None else "task"
            moment = f"in a task of step {self.step} ({self.job}), after its {self.first} {self.count}"
            record_landing(self.evidence, self.batch_id, self.sink, self.armed, moment, where)
            faults.kill_from_task(self.driver_pid)

    def run(self, function: Callable[[Iterator[Any]], Any], rows: Iterator[Any]) -> Any:
        """Your task function on one partition's rows, its commits counted."""
        self.count, self.first, self.depth = 0, "", 0
        with counting(self):
            result = function(rows)
        if self.seen is not None:
            self.seen.add((self.count, self.first))
        return result


def _task_job(method: Callable[..., Any], name: str, each_partition: Callable[..., Any]) -> Callable[..., Any]:
    """``RDD.foreachPartition`` / ``RDD.foreach`` inside your write: one step, whose tasks count their commits
    (``each_partition``: the original ``RDD.foreachPartition``, which both run through)."""

    @functools.wraps(method)
    def job(rdd: Any, function: Callable[..., Any]) -> Any:
        if not isinstance(calls.active(), WriteSteps):
            return method(rdd, function)
        per_partition = function if name == "foreachPartition" else functools.partial(_each_row, function)
        with task_job(name, rdd.context) as tasks:
            assert tasks is not None
            return each_partition(rdd, functools.partial(tasks.run, per_partition))

    job.__streamproof_counted__ = True  # type: ignore[attr-defined]
    return job


def _each_row(function: Callable[[Any], Any], rows: Iterator[Any]) -> None:
    for row in rows:
        function(row)


def task_steps(active: WriteSteps, context: Any, job: str) -> TaskSteps:
    """What the tasks of a job about to run in ``active``'s write count, with a fresh accumulator."""
    return TaskSteps(
        active.batch_id,
        active.sink,
        job,
        len(active.steps) + 1,
        active.task_moment(),
        active.driver_pid,
        active.evidence or fault_folder(),
        context.accumulator((0, ""), MostSteps()),
        active.batch,
    )


@contextlib.contextmanager
def task_job(job: str, rdd_context: Any) -> Iterator[TaskSteps | None]:
    """A job of your write that streamproof runs itself (a ``ForeachWriter``'s partitions): its tasks count their
    commits through the :class:`TaskSteps` yielded (None outside a counted write), and it is a step once it returns."""
    active = calls.active()
    if not isinstance(active, WriteSteps):
        yield None
        return
    tasks = task_steps(active, rdd_context, job)
    active.depth += 1
    try:
        yield tasks
    finally:
        active.depth -= 1
    most, first = tasks.seen.value  # the job ran: a step, with the most commits one of its tasks made
    active.took(job, most, first)


def mark(name: str) -> None:
    """``this_batch().step(name)``: a moment you mark yourself, counted as a step where it is reached."""
    active = calls.active()
    if active is not None:
        active.took(f"step {name!r}")
