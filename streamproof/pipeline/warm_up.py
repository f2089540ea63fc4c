"""Warm a Spark session on the pipeline's own batch path before it reads a record: ``streamproof run --warm-up``
(a fresh process whose first batches must not be cold) and the warm standby (:mod:`streamproof.pipeline.standby`).

Why: a fresh JVM runs its first batches cold (class loading, Spark's code generation, the JIT compiling the hot
code): on 2 cores they take seconds more than the later ones (docs/performance.md), and at a steady input rate the
backlog they leave takes a while to clear. A warm-up pays that cost before the pipeline reads its source.

What it never touches: the pipeline's checkpoint, tables and sinks. It runs a scratch copy of the pipeline
(:func:`warm_copy`: checkpoint and tables in ``<checkpoint>.warm-up-<pid>`` beside the checkpoint, deleted after)
on a sample from the start of its source, or, when the source holds nothing yet and records are JSON, on
generated records of the declared schema (:func:`synthetic_records`). Crash points are disarmed meanwhile.

Example::

    >>> warm_up(spark, load_pipeline("examples/orders_to_delta.toml"), start_query)    # doctest: +SKIP
    WarmUp(records=75000, batches=3, seconds=21.4, sample='source')
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from streamproof.checkpoint.folder import Holder
from streamproof.config import (
    AnySinkSpec,
    DeltaSinkSpec,
    DeltaSource,
    FilesSinkSpec,
    FilesSource,
    KafkaSource,
    MetricsSettings,
    PipelineSpec,
)
from streamproof.errors import PipelineError, first_line
from streamproof.faults import points as faults
from streamproof.pipeline.batches import open_batch_path
from streamproof.sinks import open_sinks
from streamproof.storage.location import Location

WARM_RECORDS = 25_000  # records per warm-up batch (fewer when the pipeline's own batches are smaller)
WARM_BATCHES = 3  # two batches, then one more after a restart of the query (a run's first write, tables there)
WARM_TIMEOUT_S = 300.0
MALFORMED_EVERY = 1_000  # one generated record in so many is not JSON: the quarantine's path is warmed too
SCRATCH_MARK = ".warm-up-"  # <checkpoint>.warm-up-<pid>: the warm-up's checkpoint and tables
# How a query of a pipeline starts (streamproof.pipeline.query.start_query, which stands on this module).
StartQuery = Callable[..., StreamingQuery]


@dataclass(frozen=True)
class WarmUp:
    """What the warm-up ran: records through the batch path, batches, seconds, and on what (``"source"``: a sample
    of the pipeline's source; ``"generated"``: records of its schema; ``"none"``: nothing to warm with)."""

    records: int
    batches: int
    seconds: float
    sample: str

    def describe(self) -> str:
        """One line for a notice.

        >>> WarmUp(75000, 3, 21.4, "generated").describe()
        '75,000 generated records, 3 batches through the batch path in 21.4 s'
        """
        if self.sample == "none":
            return f"nothing to warm with (the source is empty and its records are not JSON) in {self.seconds} s"
        what = "records of the source" if self.sample == "source" else "generated records"
        return f"{self.records:,} {what}, {self.batches} batches through the batch path in {self.seconds} s"


def warm_up(spark: SparkSession, spec: PipelineSpec, start: StartQuery, stop: threading.Event | None = None) -> WarmUp:
    """Run the pipeline's batch path (source, parse, cache and counts, quarantine, every sink's keyed commit) on a
    sample of its source into a scratch copy of its checkpoint and tables (:func:`warm_copy`): two batches, then one
    more after a restart of the query on that checkpoint, as a restart's first batch runs (the first write of a
    run, on tables that exist). A source that holds nothing yet: generated records of the schema instead (JSON
    records only). Crash points are disarmed meanwhile; the scratch copy is deleted after. ``stop`` set: it ends
    at once.

    >>> warm_up(spark, load_pipeline("examples/orders_to_delta.toml"), start_query)    # doctest: +SKIP
    WarmUp(records=75000, batches=3, seconds=21.4, sample='source')
    """
    started, stop = time.monotonic(), stop or threading.Event()
    scratch = spec.checkpoint_dir.with_name(f"{spec.checkpoint_dir.name}{SCRATCH_MARK}{Holder.me().pid}")
    _remove_leftovers(spec.checkpoint_dir)
    try:
        with faults.disarmed():
            records, batches = _run_batches(spark, warm_copy(spec, scratch), start, stop)
            sample = "source"
            if records == 0 and not stop.is_set():
                sample = "none"
                if spec.transform.format == "json":
                    scratch.delete(recursive=True)
                    generated = warm_copy(spec, scratch, source=_write_generated(spark, spec, scratch / "input"))
                    records, batches = _run_batches(spark, generated, start, stop)
                    sample = "generated"
    finally:
        for query in spark.streams.active:  # only the warm-up's run in this session yet
            query.stop()
        scratch.delete(recursive=True)
    return WarmUp(records, batches, round(time.monotonic() - started, 1), sample)


def _run_batches(spark: SparkSession, warm: PipelineSpec, start: StartQuery, stop: threading.Event) -> tuple[int, int]:
    # By batch id, over both queries: the first query is stopped once its writer has two results, which may be
    # before Spark logged the second one's commit; the restarted query then runs that batch again before the third.
    rows: dict[int, int] = {}
    for wanted, every in ((WARM_BATCHES - 1, WARM_BATCHES - 1), (1, WARM_BATCHES)):  # (this query's, all batches)
        if stop.is_set():
            break
        writer = open_batch_path(spark, warm, open_sinks(warm), exactly_once=False)
        query = start(spark, warm, writer, available_now=True)
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while (
            query.isActive
            and (len(writer.results) < wanted or len(rows.keys() | writer.results.keys()) < every)
            and time.monotonic() < deadline
        ):
            if stop.wait(0.05):
                break
        query.stop()
        if (error := query.exception()) is not None:  # said by the caller: "warm-up failed (...); starting cold"
            raise PipelineError(f"a warm-up batch failed: {first_line(error)}")
        rows.update({batch_id: result.rows_in or 0 for batch_id, result in writer.results.items()})
    return sum(rows.values()), len(rows)


def warm_copy(spec: PipelineSpec, scratch: Location, source: FilesSource | None = None) -> PipelineSpec:
    """The pipeline with its checkpoint, quarantine and sinks under ``scratch``, reading a few small batches from the
    start of its source (or from ``source``). Delta and Parquet sinks keep their kind and mode; PostgreSQL and Kafka
    sinks become scratch Delta tables (their Python tasks are not warmed, the JVM's side of the batch is).

    >>> warm_copy(spec, Location("/tmp/warm")).sink_specs[0].path                     # doctest: +SKIP
    '/tmp/warm/tables/orders'
    """
    sinks = [_scratch_sink(sink, scratch) for sink in spec.sink_specs]
    warm_source = source or spec.source
    if isinstance(warm_source, KafkaSource):
        warm_source = warm_source.model_copy(
            update={"starting_offsets": "earliest", "max_offsets_per_trigger": _batch_records(spec)}
        )
    elif isinstance(warm_source, FilesSource | DeltaSource):
        warm_source = warm_source.model_copy(update={"max_files_per_trigger": 1})
    return spec.model_copy(
        update={
            "name": f"{spec.name}-warm-up"[:100],
            "checkpoint": str(scratch / "checkpoint"),
            "source": warm_source,
            "transform": spec.transform.model_copy(update={"quarantine": str(scratch / "tables" / "_quarantine")}),
            **({"sink": sinks[0]} if spec.sink is not None else {"sinks": sinks}),
            "metrics": MetricsSettings(),
        }
    )


def _batch_records(spec: PipelineSpec) -> int:
    """Records per warm-up batch: :data:`WARM_RECORDS`, or fewer when the pipeline's own Kafka batches are smaller."""
    return min(WARM_RECORDS, getattr(spec.source, "max_offsets_per_trigger", None) or WARM_RECORDS)


def _write_generated(spark: SparkSession, spec: PipelineSpec, folder: Location) -> FilesSource:
    """:data:`WARM_BATCHES` JSON-lines files of generated records in ``folder``; the files source reading them."""
    schema = spark.createDataFrame([], spec.transform.schema_).schema
    per_batch = _batch_records(spec)
    lines = synthetic_records(schema, WARM_BATCHES * per_batch)
    for number in range(WARM_BATCHES):
        text = "\n".join(next(lines) for _ in range(per_batch)) + "\n"
        (folder / f"warm-{number}.json").write_text(text)
    return FilesSource(kind="files", path=str(folder), max_files_per_trigger=1)


def synthetic_records(schema: T.StructType, count: int) -> Iterator[str]:
    """``count`` JSON records of ``schema``, every field set (distinct strings, so a dedup key keeps them all; the
    time now, so a watermark passes none as late); one in :data:`MALFORMED_EVERY` is not JSON.

    >>> schema = T.StructType([T.StructField("id", T.StringType()), T.StructField("n", T.LongType())])
    >>> list(synthetic_records(schema, 2))
    ['{"id": "warm-0", "n": 0}', '{"id": "warm-1", "n": 1}']
    """
    now = dt.datetime.now(dt.UTC)
    for number in range(count):
        if number % MALFORMED_EVERY == MALFORMED_EVERY - 1:
            yield "{not json"
        else:
            yield json.dumps({field.name: _value(field.dataType, number, now) for field in schema.fields})


def _value(kind: T.DataType, number: int, now: dt.datetime) -> Any:
    if isinstance(kind, T.StringType | T.VarcharType | T.CharType):
        return f"warm-{number}"
    if isinstance(kind, T.BooleanType):
        return number % 2 == 0
    if isinstance(kind, T.ByteType):
        return number % 100
    if isinstance(kind, T.IntegralType):
        return number
    if isinstance(kind, T.DecimalType):
        whole = number % 10 ** min(kind.precision - kind.scale, 6)
        return whole + 0.5 if kind.scale > 0 else whole
    if isinstance(kind, T.FractionalType):
        return number * 0.25
    if isinstance(kind, T.TimestampType | T.TimestampNTZType):
        return (now - dt.timedelta(milliseconds=number % 1000)).isoformat(timespec="milliseconds")
    if isinstance(kind, T.DateType):
        return now.date().isoformat()
    if isinstance(kind, T.ArrayType):
        return [_value(kind.elementType, number, now)]
    if isinstance(kind, T.MapType):
        return {"k": _value(kind.valueType, number, now)}
    if isinstance(kind, T.StructType):
        return {field.name: _value(field.dataType, number, now) for field in kind.fields}
    return None  # binary and rarer types: absent (a required one sends the record to quarantine, which is warmed too)


def _scratch_sink(sink: AnySinkSpec, scratch: Location) -> AnySinkSpec:
    path = str(scratch / "tables" / sink.name)
    if isinstance(sink, DeltaSinkSpec | FilesSinkSpec):
        return sink.model_copy(update={"path": path})
    return DeltaSinkSpec(kind="delta", label=sink.name, path=path)


def _remove_leftovers(checkpoint: Location) -> None:
    """Scratch copies of warm-ups of this host whose process died during the warm-up."""
    for name in checkpoint.parent.names():
        owner = name.rpartition(SCRATCH_MARK)[2] if name.startswith(checkpoint.name + SCRATCH_MARK) else ""
        if owner.isdigit() and not Holder(int(owner), Holder.me().host).alive():
            (checkpoint.parent / name).delete(recursive=True)
