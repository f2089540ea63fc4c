"""``[sink] kind = "python"``: your own sink, written in PySpark (a ``foreachBatch`` function, as you would write it).

streamproof hands your ``write`` function every batch, replays after a crash included, with a :class:`YourBatch`
(id, pipeline, start and end offsets, the sink's ``options``), and keeps no record of its own in your sink: whether
a replay writes twice is your code's decision, which is the question ``prove --matrix`` answers for it
(:func:`streamproof.harness.matrix.guarantee_given`). ``read`` returns what the sink holds, with the ``_src_*``
lineage columns, for verification.

A proof cannot see inside your write: mark each moment between two of its commits with ``batch.step("...")``; the
``mid-sink-write`` crash point is a SIGKILL at the first one a write reaches (in the driver, or in a task).

Example (the shape of a write function; examples/your_code/shop/sinks.py has four)::

    >>> def write(rows, batch):                                                     # doctest: +SKIP
    ...     with psycopg.connect(batch.options["conninfo"]) as connection:         # one transaction:
    ...         if not already_written(connection, batch.pipeline, batch.id):     # the ledger checked,
    ...             insert(connection, rows.collect())                              # the rows and
    ...             record(connection, batch.pipeline, batch.id)                    # the ledger written together
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from streamproof import faults
from streamproof.config import PipelineSpec, PythonSinkSpec
from streamproof.errors import ConfigError
from streamproof.sinks.base import Batch, Sink, SinkCommit, SinkWrite
from streamproof.your_modules import importable_beside, load_function, ship_module

Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class YourBatch:
    """What your sink's ``write`` gets beside the rows. Picklable: usable inside ``foreachPartition``.

    >>> batch = YourBatch(7, "orders", {"orders": {"0": 10}}, {"orders": {"0": 20}})
    >>> batch.id, batch.step("rows committed")
    (7, None)
    """

    id: int
    pipeline: str
    start_offsets: Offsets | None
    end_offsets: Offsets
    options: dict[str, Any] = field(default_factory=dict)
    crash_at_step: bool = False  # armed by the proof's mid-sink-write point for this sink and batch
    driver_pid: int = 0

    def step(self, name: str) -> None:
        """A moment between two commits of your write: where the proof's ``mid-sink-write`` crash lands (SIGKILL of
        the whole run, from the driver or from a task). Does nothing otherwise."""
        if not self.crash_at_step:
            return
        print(f"[streamproof] mid-sink-write at step {name!r} of batch {self.id}: SIGKILL", file=sys.stderr, flush=True)
        if os.getpid() == self.driver_pid:
            faults.kill_own_process_group()
        faults.kill_from_task(self.driver_pid)


class PythonSink(Sink):
    """Your sink: streamproof calls ``write`` with every batch and ``read`` for verification, and claims nothing."""

    kind = "python"
    spec: PythonSinkSpec
    # The mid-sink-write point is met inside your write, at its first batch.step(...): no watcher kills from outside.
    writes_in_python_tasks = True
    keeps_batch_records = False

    def __init__(self, pipeline: PipelineSpec, spec: PythonSinkSpec) -> None:
        super().__init__(pipeline, spec)
        importable_beside(pipeline)
        self._write = load_function(spec.write, key=f"sink {spec.name}: write")
        self._read = load_function(spec.read, key=f"sink {spec.name}: read") if spec.read else None

    @property
    def location(self) -> str:
        return f"python:{self.spec.write}"

    def prepare(self, spark: SparkSession) -> None:
        """Ship your functions' package to Spark's Python workers (a write may run code in tasks)."""
        for name in filter(None, (self.spec.write, self.spec.read)):
            ship_module(spark, name)

    def replay_check(self, batch: Batch) -> bool:
        return False  # your code decides what a replay writes: every batch is handed to it

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        """Call your ``write(rows, batch)``; its return value is ignored, and the batch counts as written."""
        yours = YourBatch(batch.batch_id, batch.pipeline, batch.start_offsets, batch.end_offsets,
                          dict(self.spec.options), crash_at_step=batch.task_fault == faults.MID_SINK_WRITE,
                          driver_pid=os.getpid())  # fmt: skip
        self._write(rows, yours)
        return SinkWrite(batch.rows)

    def commits(self) -> list[SinkCommit]:
        return []  # streamproof keeps no record in your sink

    def read(self, spark: SparkSession) -> DataFrame | None:
        """Your ``read(spark)`` (or ``read(spark, options)``): the rows the sink holds, with lineage."""
        if self._read is None:
            raise ConfigError(f"sink {self.name}: verification reads what your sink holds with read = "
                              '"module:function" (returning its rows with the _src_* columns): set it')  # fmt: skip
        takes_options = len(inspect.signature(self._read).parameters) >= 2
        held = self._read(spark, dict(self.spec.options)) if takes_options else self._read(spark)
        if held is not None and not isinstance(held, DataFrame):
            raise ConfigError(f"sink {self.name}: read returned {type(held).__name__}, not a DataFrame (or None)")
        return held
