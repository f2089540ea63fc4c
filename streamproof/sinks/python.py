"""``[sink] kind = "python"``: your own sink, the ``foreachBatch`` function (or ``ForeachWriter``) you wrote for Spark,
run unchanged.

streamproof calls it as Spark does, for every batch, replays after a crash included:

* a function ``write(batch_df, batch_id)``: ``batch_id`` is a plain ``int`` (Spark's), and the sink's ``options``
  are passed as keyword arguments the function names (``write(batch_df, batch_id, table="orders")``, as
  ``functools.partial`` would), so one module serves several sinks;
* a ``ForeachWriter``: a class (made with the options as keyword arguments) or an object with ``process(row)`` and,
  optionally, ``open(partition_id, epoch_id)`` and ``close(error)``, run through the batch's partitions as Spark's
  ``foreach`` runs it (``epoch_id`` is the batch id).

What streamproof knows of the batch beside the id is :func:`streamproof.this_batch` (offsets, a ``key`` that
survives any checkpoint). It keeps no record of its own in your sink: whether a replay writes twice is your code's
decision, which is the question ``prove --matrix`` answers for it, at every moment of your write it finds by itself
(:mod:`streamproof.your_code.steps`). ``read`` returns what the sink holds, with the ``_src_*`` lineage columns, for
verification. An exception in your code stops the run with one line naming the function, the batch and the
exception; its traceback goes to a file beside the checkpoint (:attr:`PipelineSpec.state_dir`), named in that line.

Example (examples/your_code/shop/ holds four shapes as users write them)::

    >>> def idempotent_write(batch_df, batch_id, data_path="/data/orders"):        # doctest: +SKIP
    ...     batch_df.write.format("delta").mode("append").save(data_path)
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import PipelineSpec, PythonSinkSpec
from streamproof.errors import ConfigError, PipelineError
from streamproof.faults import points as faults
from streamproof.faults.in_tasks import fault_folder
from streamproof.sinks.base import Batch, Sink, SinkCommit, SinkWrite
from streamproof.sinks.handed import HandedOut, HandOut
from streamproof.your_code import steps as your_steps
from streamproof.your_code.modules import importable_beside, load_attribute, ship_module
from streamproof.your_code.steps import WriteSteps, YourBatch

FOREACH_METHODS = ("open", "process", "close")


class PythonSink(Sink):
    """Your sink: streamproof calls your write with every batch and ``read`` for verification, and claims nothing."""

    kind = "python"
    spec: PythonSinkSpec
    # The mid-sink-write point is met inside your write, at the moment it is armed at: no watcher kills from outside.
    writes_in_python_tasks = True
    # Its records are the batches handed to it, kept beside the checkpoint (streamproof.sinks.handed).
    records_hand_outs = True

    def __init__(self, pipeline: PipelineSpec, spec: PythonSinkSpec) -> None:
        super().__init__(pipeline, spec)
        importable_beside(pipeline)
        key = f"sink {spec.name}: write"
        written = load_attribute(spec.write, key=key)
        self._writer = foreach_writer(written, dict(spec.options), f"{key} ({spec.write})")
        self._write = None if self._writer is not None else foreach_batch_function(written, spec)
        self._read = load_attribute(spec.read, key=f"sink {spec.name}: read") if spec.read else None
        if self._read is not None and not callable(self._read):
            raise ConfigError(f"sink {spec.name}: read = {spec.read!r} is not a function")
        self.handed = HandedOut(pipeline.state_dir, spec.name)

    @property
    def location(self) -> str:
        return f"python:{self.spec.write}"

    def prepare(self, spark: SparkSession) -> None:
        """Ship your functions' package to Spark's Python workers (a write may run code in tasks)."""
        for name in filter(None, (self.spec.write, self.spec.read)):
            ship_module(spark, name)

    def replay_check(self, batch: Batch) -> bool:
        """Every batch is handed to your write (your code decides what a replay writes), but not one whose id was
        handed out before with other offsets: the replay rule's refusals (:func:`replay_decision`) on the hand-outs."""
        super().replay_check(batch)
        return False

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        """Call your write with the batch (Spark's signature), counting the moments it goes through; an armed
        ``mid-sink-write`` crash kills the run at its moment. Its return value is ignored."""
        yours = YourBatch(
            batch.batch_id, batch.pipeline, batch.start_offsets, batch.end_offsets, dict(self.spec.options)
        )
        if batch.keyed:  # recorded before your code runs: a lost checkpoint cannot hand out this id again unseen
            self.handed.hand(batch.batch_id, batch.start_offsets, batch.end_offsets, yours.key)
        armed = faults.armed_moment() if batch.task_fault == faults.MID_SINK_WRITE else None
        steps = WriteSteps(batch.batch_id, self.name, armed, fault_folder(), yours)
        try:
            with your_steps.counting(steps):
                if self._writer is not None:
                    run_foreach_writer(rows, self._writer, batch.batch_id)
                else:
                    assert self._write is not None
                    self._write(rows, batch.batch_id, **self.spec.options)
        except Exception as error:
            raise self._failed(error, batch.batch_id) from None
        if batch.keyed:
            self.handed.returned(batch.batch_id)
        if steps.armed is not None:  # the write went through fewer moments: killed now, the harness told why
            steps.crash(
                not_reached(self.spec.write, batch.batch_id, steps.armed, steps.moments), "driver", reached=False
            )
        return SinkWrite(batch.rows, moments=tuple(steps.moments), unseen=tuple(steps.unseen))

    def _failed(self, error: BaseException, batch_id: int) -> PipelineError:
        """Your code raised: its traceback to a file beside the checkpoint, one line for people."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        where = self.pipeline.state_dir / "errors" / f"batch-{batch_id}-{self.name}-{stamp}.txt"
        try:
            where.parent.mkdir()
            where.write_text("".join(traceback.format_exception(error)))
            kept = f" (traceback: {where})"
        except OSError:
            traceback.print_exception(error, file=sys.stderr)
            kept = " (traceback in the run's log)"
        return PipelineError(
            f"sink {self.name}: your write {self.spec.write} failed in batch {batch_id}: {your_exception(error)}{kept}"
        )

    def commits(self) -> list[SinkCommit]:
        """The batches handed to your write (complete: your write of it returned), from the records beside the
        checkpoint: streamproof keeps nothing in your sink itself."""
        return [_as_commit(record) for record in self.handed.records()]

    def held_from(self, first_batch: int) -> dict[int, SinkCommit]:
        return {record.batch_id: _as_commit(record) for record in self.handed.records(first_batch)}

    def known_from(self, held: dict[int, SinkCommit]) -> int | None:
        ids = self.handed.batch_ids()
        return ids[0] if ids else None  # older hand-outs are no longer kept (KEPT), or were never recorded

    def last_record(self, spark: SparkSession | None) -> SinkCommit | None:
        records = self.commits()
        return records[-1] if records else None

    def read(self, spark: SparkSession) -> DataFrame | None:
        """Your ``read(spark)`` (or ``read(spark, options)``): the rows the sink holds, with lineage."""
        if self._read is None:
            raise ConfigError(
                f"sink {self.name}: verification reads what your sink holds with read = "
                '"module:function" (returning its rows with the _src_* columns): set it'
            )
        takes_options = len(inspect.signature(self._read).parameters) >= 2
        held = self._read(spark, dict(self.spec.options)) if takes_options else self._read(spark)
        if held is not None and not isinstance(held, DataFrame):
            raise ConfigError(f"sink {self.name}: read returned {type(held).__name__}, not a DataFrame (or None)")
        return held


def foreach_batch_function(function: Any, spec: PythonSinkSpec) -> Callable[..., Any]:
    """Your ``foreachBatch`` function, checked: Spark's signature ``f(batch_df, batch_id)``, and every option of the
    sink a keyword parameter of it.

    >>> def write(batch_df, batch_id, table="orders"): ...
    >>> spec = PythonSinkSpec(kind="python", write="shop:write", options={"tabel": "x"})
    >>> foreach_batch_function(write, spec)
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: sink python: options tabel are not parameters of shop:write(batch_df, ...
    """
    key = f"sink {spec.name}: write = {spec.write!r}"
    if not callable(function):
        raise ConfigError(f"{key} is neither a function nor a ForeachWriter (an object with process(row))")
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in parameters)
    if len(positional) < 2 and not variadic:
        raise ConfigError(f"{key} takes {signature}; Spark calls a foreachBatch function as f(batch_df, batch_id)")
    named = {p.name for p in parameters[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not any(p.kind == p.VAR_KEYWORD for p in parameters):
        unknown = [option for option in spec.options if option not in named]
        if unknown:
            raise ConfigError(
                f"sink {spec.name}: options {', '.join(unknown)} are not parameters of {spec.write}{signature}: "
                "name each as a keyword parameter of it, or remove it from options"
            )
    missing = [
        p.name
        for p in parameters[2:]
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in spec.options
    ]
    if missing:
        raise ConfigError(
            f"sink {spec.name}: {spec.write}{signature} needs {', '.join(missing)}: give "
            f"{' and '.join(missing)} in the sink's options"
        )
    return function  # type: ignore[no-any-return]


def foreach_writer(written: Any, options: dict[str, Any], what: str) -> Any | None:
    """Your ``ForeachWriter``: an object with ``process(row)`` (optionally ``open``/``close``), or a class of them
    made with ``options`` as keyword arguments; None when ``written`` is a plain function (a foreachBatch function).

    >>> class Writer:
    ...     def process(self, row): ...
    >>> type(foreach_writer(Writer, {}, "w")).__name__, foreach_writer(print, {}, "w")
    ('Writer', None)
    """
    if not hasattr(written, "process"):
        return None
    for method in FOREACH_METHODS:
        if hasattr(written, method) and not callable(getattr(written, method)):
            raise ConfigError(f"{what}: its {method} is not a method")
    if not inspect.isclass(written):
        return written
    try:
        return written(**options)
    except TypeError as error:
        raise ConfigError(
            f"{what}: {written.__name__}(**options) failed ({error}): its constructor takes the sink's "
            "options as keyword arguments"
        ) from None


def run_foreach_writer(rows: DataFrame, writer: Any, batch_id: int) -> None:
    """Run ``writer`` through the batch's partitions as Spark's ``foreach`` does: per partition ``open(partition_id,
    epoch_id)``, ``process(row)`` for each row if it said yes, ``close(error)``; a step of your write whose tasks
    count their commits."""
    with your_steps.task_job("ForeachWriter", rows.sparkSession.sparkContext) as tasks:
        partition = functools.partial(_foreach_partition, writer, batch_id)
        rows.rdd.foreachPartition(partition if tasks is None else functools.partial(tasks.run, partition))


def _foreach_partition(writer: Any, epoch_id: int, rows: Iterator[Any]) -> None:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition_id = context.partitionId() if context is not None else 0
    go_on = writer.open(partition_id, epoch_id) if hasattr(writer, "open") else True
    error: Exception | None = None
    try:
        if go_on:
            for row in rows:
                writer.process(row)
    except Exception as raised:  # noqa: BLE001 - handed to close(error), as Spark does, then raised again
        error = raised
    finally:
        if hasattr(writer, "close"):
            writer.close(error)
    if error is not None:
        raise error


def not_reached(write: str, batch_id: int, armed: int, moments: list[str]) -> str:
    """Why ``mid-sink-write#armed`` did not land in the write of ``batch_id``: it went through fewer moments.

    >>> not_reached("shop:write", 3, 2, ["after step 1: DataFrameWriter.save('/t')"])
    "mid-sink-write#2 not reached: shop:write's write of batch 3 went through 1 moment (after step 1: ...)"
    >>> not_reached("shop:write", 3, 1, [])[:107]
    'mid-sink-write#1 not reached: shop:write made nothing durable that streamproof can see in batch 3 (no Spark'
    """
    if not moments:
        return (
            f"mid-sink-write#{armed} not reached: {write} made nothing durable that streamproof can see in batch "
            f"{batch_id} (no Spark write, Delta commit, DB-API or JDBC commit, Kafka transaction, or "
            "this_batch().step()): its moments cannot be crashed, the proof did not exercise it"
        )
    plural = "moment" if len(moments) == 1 else "moments"
    return (
        f"mid-sink-write#{armed} not reached: {write}'s write of batch {batch_id} went through {len(moments)} "
        f"{plural} ({'; '.join(moments)})"
    )


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")


def your_exception(error: BaseException) -> str:
    """Your code's exception in one line, ``Type: message``: itself when it was raised in the driver, else the
    exception line of the last Python traceback Spark wraps a failed task's in (no Py4J or JVM lines).

    >>> your_exception(ValueError("bad row"))
    'ValueError: bad row'
    >>> your_exception(RuntimeError("Job aborted: Traceback (most recent call last):\\n  File x\\nKeyError: 'i'\\n"))
    "KeyError: 'i'"
    >>> your_exception(RuntimeError("Traceback (most recent call last):\\n  File x\\n    y()\\nerrors.Unique: dup"))
    'errors.Unique: dup'
    """
    text = str(error)
    marker = "Traceback (most recent call last):"
    if type(error).__module__.split(".")[0] not in ("py4j", "pyspark") and marker not in text:
        first = text.strip().splitlines()[0] if text.strip() else ""
        return f"{type(error).__name__}: {first}".rstrip(": ")
    frames = text[text.rfind(marker) + len(marker) :].splitlines()
    found = next(
        (line.strip() for line in frames if line and not line[0].isspace() and _EXCEPTION_LINE.match(line.strip())),
        None,
    )
    if found:
        return found[:300]
    return f"{type(error).__name__}: {text.strip().splitlines()[0][:300] if text.strip() else ''}"


def _as_commit(record: HandOut) -> SinkCommit:
    """A hand-out as the record of a batch the sink holds: completely once your write of it returned."""
    return SinkCommit(record.batch_id, record.end_offsets, keyed=True, complete=record.returned)
