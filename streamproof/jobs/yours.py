"""A job's own writes: its ``foreachBatch`` function and its ``foreach`` writer, run as Spark runs them, with the
durable steps they take counted and crashed at.

Spark calls ``f(batch_df, batch_id)`` for every batch, replays after a crash included; so does the wrapper, with
nothing in between but what a proof needs: the batch's write announced (``writing``), each durable step the function
takes found while it runs (:mod:`streamproof.your_code.steps`: a Spark or Delta write, a DB-API or JDBC commit, a
Kafka transaction, those of its tasks), the armed ``mid-sink-write#k`` taken right after its k-th step, and the
moments it went through published after it returns (the next crash run learns them). A ``foreach(writer)`` runs
through the batch's partitions as Spark's ``foreach`` runs it (``open(partition_id, epoch_id)``, ``process``,
``close``), its commits in tasks counted the same way. An exception of the function is the job's own error: its file
and line are kept, then it is raised to Spark as it would be.

Example::

    >>> def idempotent_write(batch_df, batch_id): ...
    >>> _name(idempotent_write)
    'idempotent_write'
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from streamproof.faults import points as faults
from streamproof.faults.in_tasks import fault_folder
from streamproof.jobs import inside
from streamproof.jobs.maps import refusals
from streamproof.jobs.moments import Moments, kill_an_executor_mid_write
from streamproof.jobs.patches import state_of
from streamproof.jobs.record import JobRecord
from streamproof.jobs.scan import one_line, where_in_job
from streamproof.pipeline.events import Event, WriteMoments, WriteStarted
from streamproof.sinks.python import not_reached, run_foreach_writer
from streamproof.your_code import steps as your_steps
from streamproof.your_code.steps import WriteSteps


class JobRun(Protocol):
    """What the wrapper asks of the run (:class:`streamproof.jobs.child.JobRun`)."""

    job: Path
    record: JobRecord
    moments: Moments | None

    def publish(self, event: Event) -> None: ...
    def traceback_file(self, error: BaseException) -> str: ...


def _name(function: Any) -> str:
    return str(getattr(function, "__qualname__", None) or type(function).__name__)


class YourWrite:
    """Wraps the job's write functions for one run (see the module)."""

    def __init__(self, run: JobRun) -> None:
        self.run = run

    def wrapped(self, writer: Any, written: Any, *, foreach: bool) -> Callable[[Any, int], None]:
        """The function Spark gets in place of the job's (``foreach``: a writer or a row function, run per batch)."""

        def batch(batch_df: Any, batch_id: int) -> None:
            self.write(state_of(writer)["query"], written, batch_df, int(batch_id), foreach=foreach)

        return batch

    def write(self, query: Any, written: Any, batch_df: Any, batch_id: int, *, foreach: bool) -> None:
        run = self.run
        stem = run.job.stem
        run.publish(WriteStarted(stem, batch_id, query.label))
        assert run.moments is not None
        armed = run.moments.moment_in_your_write(query, batch_id)
        steps = WriteSteps(batch_id, query.label, armed, fault_folder())
        steering = inside.steering()
        if steering is not None:
            steering.query = query.label
        context = batch_df.sparkSession.sparkContext
        group = f"streamproof-{batch_id}-{query.label}"  # the write's jobs, as Spark's event log names them
        context.setJobGroup(group, f"streamproof: batch {batch_id} -> {query.label}")
        written_now = threading.Event()
        if faults.mid_write_armed(batch_id, query.label, first_sink=True) == faults.EXECUTOR_MID_WRITE:
            watch = functools.partial(kill_an_executor_mid_write, batch_df.sparkSession, group, batch_id, query.label)
            threading.Thread(target=watch, args=(written_now,), name="streamproof-executor-fault", daemon=True).start()
        try:
            with your_steps.counting(steps):
                if foreach:
                    _run_foreach(batch_df, written, batch_id)
                else:
                    written(batch_df, batch_id)
        except BaseException as error:
            if not refusals():
                line = f"{where_in_job(error, run.job)}: {one_line(error)} (in batch {batch_id} of {query.label})"
                run.record.failed(line, run.traceback_file(error))
            raise
        finally:
            written_now.set()
            for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
                context.setLocalProperty(key, None)
            if steering is not None:
                steering.query = None
        if refusals():
            raise RuntimeError(refusals()[0])  # a refusal the function swallowed: the batch must not count as done
        if armed is not None:  # the write went through fewer moments: killed now, the harness told why
            what = _name(written)
            steps.crash(not_reached(what, batch_id, armed, steps.moments), "driver", reached=False)
        if steps.moments != query.moments:
            query.moments = list(steps.moments)
            run.record.save()
        run.publish(WriteMoments(stem, batch_id, query.label, list(steps.moments), list(steps.unseen)))


def _run_foreach(batch_df: Any, written: Any, batch_id: int) -> None:
    if hasattr(written, "process"):
        run_foreach_writer(batch_df, written, batch_id)
        return
    with your_steps.task_job("foreach", batch_df.sparkSession.sparkContext) as tasks:
        rows = functools.partial(_each_row, written)
        batch_df.rdd.foreachPartition(rows if tasks is None else functools.partial(tasks.run, rows))


def _each_row(function: Callable[[Any], Any], rows: Iterator[Any]) -> None:
    for row in rows:
        function(row)
