"""The durable steps your own write takes, found while it runs: the moments a proof crashes your code at, with no
marker in it.

Your ``foreachBatch`` function (``[sink] kind = "python"``) is code streamproof did not write, so where it can break
is where it makes something durable: between two of those steps a crash leaves the first done and the second not. For
the length of your call, in the driver, streamproof watches the calls that make something durable and counts each
one that returns:

* a Spark write: ``DataFrameWriter.save`` / ``saveAsTable`` / ``insertInto`` / ``jdbc`` / ``parquet`` / ``orc`` /
  ``json`` / ``csv`` / ``text`` / ``xml``, ``DataFrameWriterV2.append`` / ``overwrite`` / ``create`` / ...;
* a Delta commit made through Delta's Python API: ``merge(...).execute()``, ``update``, ``delete``, a table builder's
  ``execute``, ``restoreToVersion`` / ``restoreToTimestamp``, and ``spark.sql`` of a statement that writes
  (``INSERT``, ``MERGE``, ``UPDATE``, ``DELETE``, ``CREATE TABLE``, ...);
* a DB-API commit: psycopg's ``Connection.commit`` (also the one its ``with`` block makes) and an outer
  ``transaction()`` block, psycopg2's and sqlite3's ``commit``, and a JDBC ``commit`` called through Py4J;
* a Kafka transaction: confluent-kafka's ``Producer.commit_transaction``;
* a job that runs your code in tasks (``foreachPartition``, ``foreach``, a ``ForeachWriter``): inside its tasks the
  same commits are counted, task by task;
* ``this_batch().step("...")`` where you mark a moment yourself (optional).

Nested calls count once (a ``saveAsTable`` that runs a ``save``). The moments of a write (:func:`moments`) are: after
each step in the driver; and, for a job whose tasks committed, after the j-th commit of a task (the first task to
reach it: the others may or may not have committed theirs). ``mid-sink-write#k`` (:mod:`streamproof.faults`) SIGKILLs
the whole run at the k-th moment; a clean batch tells how many there are. A write in which none of these is seen has
no moment: a proof says "not exercised", never "clean".

Example::

    >>> steps = [Step("DataFrameWriter.save('/data/orders')"), Step("DataFrameWriter.save('/data/control')")]
    >>> for moment in moments(steps):
    ...     print(moment)
    after step 1: DataFrameWriter.save('/data/orders')
    after step 2: DataFrameWriter.save('/data/control')
    >>> for moment in moments([Step("foreachPartition", task_steps=2, task_what="psycopg commit")]):
    ...     print(moment)
    in a task of step 1 (foreachPartition), after its psycopg commit 1
    in a task of step 1 (foreachPartition), after its psycopg commit 2
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamproof import faults
from streamproof.task_faults import fault_folder

EVIDENCE_PREFIX = "moment-"  # <fault folder>/moment-<batch>-<sink>.json: the moment a crash landed at, for the harness


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
            found += [f"in a task of step {number} ({step.what}), after its {step.task_what} {j}"
                      for j in range(1, step.task_steps + 1)]  # fmt: skip
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
        width = step.task_steps or 1
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

    def __init__(self, batch_id: int, sink: str, armed: int | None, evidence: str | None = None,
                 batch: YourBatch | None = None) -> None:  # fmt: skip
        self.batch_id = batch_id
        self.batch = batch
        self.sink = sink
        self.armed = armed  # the moment to crash at (mid-sink-write#k), None: count only
        self.evidence = evidence  # the fault folder, where the landing is written before the kill
        self.steps: list[Step] = []
        self.depth = 0  # inside a counted call: what it runs is part of that step
        self.thread = threading.get_ident()
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
        found = landing([*self.steps, Step("job", task_steps=sys.maxsize)], self.armed)
        return found.task_step if found is not None and found.step == len(self.steps) + 1 else None

    def crash(self, moment: str, where: str) -> None:
        record_landing(self.evidence, self.batch_id, self.sink, self.armed or 0, moment, where)
        print(f"[streamproof] mid-sink-write#{self.armed} of {self.sink} in batch {self.batch_id}, {moment}: SIGKILL",
              file=sys.stderr, flush=True)  # fmt: skip
        faults.kill_own_process_group()


def record_landing(folder: str | None, batch_id: int, sink: str, moment: int, what: str, where: str) -> None:
    """Write where a crash of your write lands (before the kill): the harness's evidence that it happened there."""
    if folder is None:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"{EVIDENCE_PREFIX}{batch_id}-{sink}.json"
    path.write_text(json.dumps({"moment": moment, "what": what, "where": where}))


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
    active = _ACTIVE
    if active is None or active.thread != threading.get_ident() or active.batch is None:
        raise RuntimeError("this_batch() is only known inside a write streamproof hands a batch to (a python sink's "
                           "write)")  # fmt: skip
    return active.batch  # type: ignore[no-any-return]


# --- the calls that make something durable ---------------------------------------------------------------------------

_ACTIVE: WriteSteps | TaskSteps | None = None


def _counting() -> WriteSteps | TaskSteps | None:
    """The steps being counted in this thread, when none of their counted calls is running."""
    active = _ACTIVE
    if active is None or active.thread != threading.get_ident() or active.depth:
        return None
    return active


def _described(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``DataFrameWriter.save('/data/orders')``: the call and its first argument that names a place (a path, a
    table), if any."""
    named = [value for value in (*args[1:2], kwargs.get("path"), kwargs.get("table"), kwargs.get("url"))
             if isinstance(value, str)]  # fmt: skip
    return f"{name}({named[0]!r})" if named else f"{name}()"


def _counted(name: str, describe: Callable[[tuple[Any, ...], dict[str, Any], Any], str | None] | None = None
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:  # fmt: skip
    """A method made a step: when it returns (not when it raises) inside your write, the write took a step."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(*args: Any, **kwargs: Any) -> Any:
            active = _counting()
            if active is None:
                return method(*args, **kwargs)
            active.depth += 1
            try:
                result = method(*args, **kwargs)
            finally:
                active.depth -= 1
            what = describe(args, kwargs, result) if describe is not None else _described(name, args, kwargs)
            if what is not None:
                active.took(what)
            return result

        counted.__streamproof_counted__ = True  # type: ignore[attr-defined]
        return counted

    return wrap


WRITING_STATEMENTS = ("INSERT", "MERGE", "UPDATE", "DELETE", "CREATE", "REPLACE", "TRUNCATE", "DROP", "ALTER", "COPY",
                      "RESTORE", "OPTIMIZE", "VACUUM")  # fmt: skip


def writing_statement(query: str) -> str | None:
    """The statement's first words when it writes (a step), None for a query or a temporary view.

    >>> writing_statement("  insert into t select * from s"), writing_statement("SELECT 1")
    ('INSERT INTO t', None)
    >>> writing_statement("CREATE OR REPLACE TEMP VIEW v AS SELECT 1") is None
    True
    """
    words = query.split()
    if not words or words[0].upper() not in WRITING_STATEMENTS:
        return None
    if {"TEMP", "TEMPORARY"} & {word.upper() for word in words[:5]}:
        return None
    return " ".join([word.upper() for word in words[:2]] + words[2:3])


def _sql_step(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
    query = args[1] if len(args) > 1 else kwargs.get("sqlQuery", "")
    statement = writing_statement(query) if isinstance(query, str) else None
    return f"spark.sql {statement} ..." if statement else None


def _py4j_commit(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
    return "JDBC commit" if getattr(args[0], "name", None) == "commit" else None  # a py4j call of conn.commit()


_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def install() -> None:
    """Make the calls of the module docstring steps, once per process (a no-op outside your write). In the driver when
    a python sink opens, in a Python worker when one of your tasks starts."""
    global _INSTALLED
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
        from pyspark import RDD
        from pyspark.sql import SparkSession
        from pyspark.sql.readwriter import DataFrameWriter, DataFrameWriterV2

        for name in ("save", "saveAsTable", "insertInto", "jdbc", "parquet", "orc", "json", "csv", "text", "xml"):
            _patch(DataFrameWriter, name, f"DataFrameWriter.{name}")
        for name in ("append", "overwrite", "overwritePartitions", "create", "replace", "createOrReplace"):
            _patch(DataFrameWriterV2, name, f"DataFrameWriterV2.{name}")
        _patch(SparkSession, "sql", "spark.sql", _sql_step)
        with contextlib.suppress(ImportError):
            from pyspark.sql.merge import MergeIntoWriter

            _patch(MergeIntoWriter, "merge", "MergeIntoWriter.merge")
        with contextlib.suppress(ImportError):
            from delta.tables import DeltaMergeBuilder, DeltaTable, DeltaTableBuilder

            _patch(DeltaMergeBuilder, "execute", "Delta merge(...).execute")
            _patch(DeltaTableBuilder, "execute", "Delta table builder execute")
            for name in ("update", "delete", "restoreToVersion", "restoreToTimestamp"):
                _patch(DeltaTable, name, f"DeltaTable.{name}")
        each_partition = RDD.foreachPartition
        if not getattr(each_partition, "__streamproof_counted__", False):
            for name in ("foreachPartition", "foreach"):
                setattr(RDD, name, _task_job(getattr(RDD, name), name, each_partition))
        with contextlib.suppress(ImportError):
            import psycopg

            _patch(psycopg.Connection, "commit", "psycopg commit", lambda *_: "psycopg commit")
            _patch_transaction_exit(psycopg.Transaction)
        with contextlib.suppress(ImportError):
            from py4j.java_gateway import JavaMember

            _patch(JavaMember, "__call__", "JDBC commit", _py4j_commit)


def _patch(owner: type, name: str, label: str,
           describe: Callable[[tuple[Any, ...], dict[str, Any], Any], str | None] | None = None) -> None:  # fmt: skip
    method = getattr(owner, name, None)
    if method is None or getattr(method, "__streamproof_counted__", False):
        return
    setattr(owner, name, _counted(label, describe)(method))


def _patch_transaction_exit(transaction: type) -> None:
    """psycopg's ``with connection.transaction():`` commits at the end of its outer block, without an exception."""
    exit_block = getattr(transaction, "__exit__")  # noqa: B009 - typed as plain type: mypy knows no __exit__ on it

    def describe(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
        block, exc_type = args[0], args[1] if len(args) > 1 else None
        outer = getattr(block, "_outer_transaction", False)
        return "psycopg transaction commit" if exc_type is None and outer else None

    setattr(transaction, "__exit__", _counted("psycopg transaction", describe)(exit_block))  # noqa: B010


# Commits of clients written in C, whose methods cannot be replaced: seen through the profile hook as they return.
C_COMMITS = {("cimpl", "Producer", "commit_transaction"): "Kafka commit_transaction",
             ("psycopg2.extensions", "connection", "commit"): "psycopg2 commit",
             ("sqlite3", "Connection", "commit"): "sqlite3 commit"}  # fmt: skip


def _c_commit(function: Any) -> str | None:
    owner = type(getattr(function, "__self__", None))
    return C_COMMITS.get((owner.__module__, owner.__name__, getattr(function, "__name__", "")))


def _profile(frame: Any, event: str, arg: Any) -> None:
    if event == "c_return" and (what := _c_commit(arg)) is not None and (active := _counting()) is not None:
        active.took(what)


@contextlib.contextmanager
def counting(steps: WriteSteps | TaskSteps) -> Iterator[WriteSteps | TaskSteps]:
    """Count ``steps`` in this thread for the length of the block (your write, or one of its tasks)."""
    global _ACTIVE
    install()
    outer, profile = _ACTIVE, sys.getprofile()
    _ACTIVE = steps
    sys.setprofile(_profile)
    try:
        yield steps
    finally:
        sys.setprofile(profile)
        _ACTIVE = outer


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
    thread: int = field(default=0, compare=False)

    def took(self, what: str, task_steps: int = 0, task_what: str = "") -> None:
        self.count += 1
        self.first = self.first or what
        if self.armed == self.count:
            from pyspark import TaskContext

            context = TaskContext.get()
            where = f"task {context.partitionId()}" if context is not None else "task"
            moment = f"in a task of step {self.step} ({self.job}), after its {what} {self.count}"
            record_landing(self.evidence, self.batch_id, self.sink, self.armed, moment, where)
            faults.kill_from_task(self.driver_pid)

    def run(self, function: Callable[[Iterator[Any]], Any], rows: Iterator[Any]) -> Any:
        """Your task function on one partition's rows, its commits counted."""
        self.count, self.first, self.depth, self.thread = 0, "", 0, threading.get_ident()
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
        active = _counting()
        if not isinstance(active, WriteSteps):
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
    return TaskSteps(active.batch_id, active.sink, job, len(active.steps) + 1, active.task_moment(), active.driver_pid,
                     active.evidence or fault_folder(), context.accumulator((0, ""), MostSteps()),
                     active.batch)  # fmt: skip


@contextlib.contextmanager
def task_job(job: str, rdd_context: Any) -> Iterator[TaskSteps | None]:
    """A job of your write that streamproof runs itself (a ``ForeachWriter``'s partitions): its tasks count their
    commits through the :class:`TaskSteps` yielded (None outside a counted write), and it is a step once it returns."""
    active = _counting()
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
    active = _counting()
    if active is not None:
        active.took(f"step {name!r}")
