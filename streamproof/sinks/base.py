"""What every sink implements, and how a batch is described to it.

Idempotency rule shared by all sinks (DESIGN.md, layer 3): under exactly-once a sink writes a batch
*keyed* on (pipeline, batch id) in the same atomic step as the data (Delta SetTransaction, PostgreSQL
ledger row, Kafka commit marker, Spark's file-sink log), so a batch that Spark replays after a crash
writes nothing the second time. Every keyed commit also records the batch's source end offsets, so a
lost checkpoint is detected instead of silently replayed (:func:`refuse_if_checkpoint_lost`).

Example (a sink used from your own ``foreachBatch``)::

    >>> sink = open_sink(spec, spec.sink_specs[0])                                   # doctest: +SKIP
    >>> sink.write(rows, Batch("orders", batch_id, end_offsets, keyed=True))         # doctest: +SKIP
    SinkWrite(rows_out=99900, replay_skipped=False)
"""

from __future__ import annotations

import itertools
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from streamproof.checkpoint import is_empty
from streamproof.config import (
    DeltaSinkSpec,
    FilesSinkSpec,
    KafkaSinkSpec,
    PipelineSpec,
    PostgresSinkSpec,
)
from streamproof.errors import PipelineError
from streamproof.guarantees import wiring_for
from streamproof.transform import COORDINATES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

AnySinkSpec = DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Batch:
    """One micro-batch as a sink sees it."""

    pipeline: str
    batch_id: int
    end_offsets: Offsets  # in the key order of Spark's offset log (it decides the partition numbering)
    keyed: bool  # exactly-once: key the write on (pipeline, batch id) so that a replay is skipped
    rows: int = 0  # valid rows in the batch (counted once, before the writes)
    # Crash harness only: a sink writing from Python tasks kills the pipeline at its mid-write point.
    kill_mid_write: bool = False

    def commit_record(self) -> dict[str, Any]:
        """What every commit of the batch records beside the data (Delta userMetadata, ledger, marker)."""
        return {"pipeline": self.pipeline, "batch_id": self.batch_id, "end_offsets": self.end_offsets}

    def commit_metadata(self) -> str:
        # Key order kept as Spark logged it: a rebuilt checkpoint must list partitions in the same order.
        return json.dumps({"streamproof": self.commit_record()})


@dataclass(frozen=True)
class SinkWrite:
    """What a sink did with a batch."""

    rows_out: int
    replay_skipped: bool = False  # a replayed batch the sink already held: nothing was written


@dataclass(frozen=True)
class SinkCommit:
    """A batch of this pipeline that the sink holds, as recorded in the sink itself."""

    batch_id: int
    end_offsets: Offsets | None  # None where the sink's log does not record offsets
    keyed: bool  # written with the batch key (so a replay of it is skipped)
    complete: bool = True  # False: only some partitions of the batch committed (per-partition sinks)


@dataclass(frozen=True)
class Check:
    """How verification compares this sink with the source (:mod:`streamproof.verify`).

    * ``records``: one row per valid record, matched on source coordinates (or the dedup key);
    * ``latest``: one row per business ``key``, holding the key's latest record by ``order_by``;
    * ``totals``: one row per ``by`` group holding the sums of ``sums`` and the record count ``events``.
    """

    kind: Literal["records", "latest", "totals"]
    key: str | None = None
    order_by: str | None = None
    by: str | None = None
    sums: tuple[str, ...] = ()


class Sink(ABC):
    """A destination of a pipeline. Subclasses live in :mod:`streamproof.sinks` (delta, postgres, kafka, files)."""

    kind: ClassVar[str]
    # Whether an unkeyed write becomes visible in parts before it completes (PostgreSQL commits per task,
    # a plain Kafka producer): a kill mid-write then leaves part of the batch behind.
    partial_writes_visible: ClassVar[bool] = False
    # Whether the sink writes from PySpark's Python tasks (so its mid-write crash point is inside them).
    writes_in_python_tasks: ClassVar[bool] = False

    def __init__(self, pipeline: PipelineSpec, spec: AnySinkSpec) -> None:
        self.pipeline = pipeline
        self.spec = spec
        self._first_write_of_run = True

    def is_replay(self, batch: Batch) -> bool:
        """On the first keyed write of a run (the only one that can be a replay): whether the sink holds the
        batch already; a sink holding that batch id with other offsets is a precise error (:func:`holds_batch`).
        The sink's log is read once per run, not per batch."""
        if not self._first_write_of_run or not batch.keyed:
            return False
        self._first_write_of_run = False
        return holds_batch(self, batch)

    @property
    def name(self) -> str:
        """The sink's label in progress lines and reports."""
        return self.spec.name

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the rows go, for messages (a path, ``postgresql://.../table``, ``kafka://topic``); no secret."""

    @property
    def check(self) -> Check:
        return Check("records")

    @property
    def data_files_folder(self) -> Path | None:
        """The local folder a write creates its data files in (Delta, Parquet), for the crash harness."""
        return None

    def prepare(self, spark: SparkSession) -> None:  # noqa: B027 - optional hook
        """Create what the sink needs (table, topic) before the first batch; idempotent."""

    @abstractmethod
    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        """Write the batch's valid rows (keyed on the batch when ``batch.keyed``)."""

    @abstractmethod
    def commits(self) -> list[SinkCommit]:
        """This pipeline's batches held by the sink, oldest first, read from the sink itself."""

    @abstractmethod
    def read(self, spark: SparkSession) -> DataFrame | None:
        """The sink's rows as a reader sees them now (for verification); None if it does not exist yet."""

    def needs_spark_for_commits(self) -> bool:
        """Whether reading the sink's commits needs a Spark session (a Delta table on object storage)."""
        return False

    def last_commit(self, spark: SparkSession | None) -> SinkCommit | None:
        """The last batch the sink holds completely."""
        complete = [commit for commit in self.commits() if commit.complete]
        return complete[-1] if complete else None


class FolderSink(Sink):
    """A sink that writes data files under a path of the pipeline file (Delta table, Parquet folder)."""

    def __init__(self, pipeline: PipelineSpec, spec: AnySinkSpec) -> None:
        super().__init__(pipeline, spec)
        self.path = pipeline.resolve_path(spec.path)  # type: ignore[union-attr]

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def data_files_folder(self) -> Path | None:
        return None if "://" in str(self.path) else self.path


@dataclass(frozen=True)
class CrashInTask:
    """The ``mid-sink-write`` crash of a sink that writes from Python tasks: the batch's last partition
    kills the pipeline's process tree when its write reaches the point, by which time the other
    partitions may have committed: the hardest case for a per-partition commit."""

    driver_pid: int
    partition_id: int

    @staticmethod
    def for_batch(batch: Batch, partitions: int) -> CrashInTask | None:
        import os

        return CrashInTask(os.getpid(), partitions - 1) if batch.kill_mid_write else None

    def reached(self, partition_id: int) -> None:
        if partition_id == self.partition_id:
            from streamproof.faults import kill_from_task

            kill_from_task(self.driver_pid)


BATCH_COMPLETE = "*"  # the source key of the record a per-partition sink writes once every partition committed


def peek_source_key(rows: Iterable[tuple[Any, ...]], columns: tuple[str, ...]) -> tuple[str | None, Iterator[Any]]:
    """The key of a task's share of a batch, by content: ``<topic>/<partition>@<first offset>`` of its first
    row, and the rows (the first one put back). ``None`` for a task without rows.

    Spark numbers a batch's partitions in an order that need not be the same when the batch is replayed
    (after a rebuilt checkpoint it was not), so per-partition commits are keyed on what a task writes, not
    on its number. A Kafka split holds one source partition in offset order, so the first row's coordinates
    name it, and two splits of one partition (``minPartitions``) differ by their first offset.

    >>> key, rows = peek_source_key(iter([("t", 2, 40), ("t", 2, 41)]), ("_src_topic", "_src_partition", "_src_offset"))
    >>> key, len(list(rows))
    ('t/2@40', 2)
    """
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        return None, iter(())
    topic, partition, offset = (first[columns.index(column)] for column in COORDINATES)
    return f"{topic}/{partition}@{offset}", itertools.chain([first], iterator)


class SourceRanges:
    """Per source topic-partition: lowest offset, highest offset and count of the rows a partition wrote."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.positions = tuple(columns.index(column) for column in COORDINATES)
        self.ranges: dict[str, list[int]] = {}
        self.count = 0

    def add(self, row: tuple[Any, ...]) -> None:
        topic_at, partition_at, offset_at = self.positions
        offset = int(row[offset_at])
        key = f"{row[topic_at]}/{row[partition_at]}"
        low_high_count = self.ranges.setdefault(key, [offset, offset, 0])
        low_high_count[0], low_high_count[1] = min(low_high_count[0], offset), max(low_high_count[1], offset)
        low_high_count[2] += 1
        self.count += 1

    def as_json(self) -> dict[str, list[int]]:
        return dict(sorted(self.ranges.items()))

    def single_source(self) -> str:
        """The one source partition the rows came from (a task must not mix several: see peek_source_key)."""
        if len(self.ranges) != 1:
            raise PipelineError(
                f"a write task received records of {len(self.ranges)} source partitions: {sorted(self.ranges)}; "
                "streamproof expects one per task (no repartitioning before a per-partition sink)"
            )
        return next(iter(self.ranges))


def open_sink(pipeline: PipelineSpec, spec: AnySinkSpec) -> Sink:
    """The runtime sink for one ``[sink]`` / ``[[sinks]]`` entry of a pipeline file."""
    if isinstance(spec, DeltaSinkSpec):
        from streamproof.sinks.delta import DeltaSink

        return DeltaSink(pipeline, spec)
    if isinstance(spec, PostgresSinkSpec):
        from streamproof.sinks.postgres import PostgresSink

        return PostgresSink(pipeline, spec)
    if isinstance(spec, KafkaSinkSpec):
        from streamproof.sinks.kafka import KafkaSink

        return KafkaSink(pipeline, spec)
    from streamproof.sinks.files import FilesSink

    return FilesSink(pipeline, spec)


def open_sinks(pipeline: PipelineSpec) -> list[Sink]:
    """Every sink of the pipeline, in file order."""
    return [open_sink(pipeline, spec) for spec in pipeline.sink_specs]


def refuse_if_checkpoint_lost(spark: SparkSession | None, pipeline: PipelineSpec, sinks: list[Sink]) -> None:
    """Refuse to start an exactly-once pipeline whose checkpoint is empty while a sink holds its batches.

    A fresh checkpoint numbers batches from 0 again: keyed sinks would skip them as already written
    (silent loss), and Delta's own streaming sink, keyed on the checkpoint's query id, would write them
    again (silent duplicates). Neither is acceptable, so the start is refused, naming what the sink holds.
    """
    if not wiring_for(pipeline.guarantee).idempotent_sink or not is_empty(pipeline.checkpoint_dir):
        return
    for sink in sinks:
        if spark is None and sink.needs_spark_for_commits():
            continue  # checked again once the session runs
        last = sink.last_commit(spark)
        if last is not None:
            offsets = "" if last.end_offsets is None else f" (offsets {json.dumps(last.end_offsets)})"
            raise PipelineError(
                f"checkpoint {pipeline.checkpoint_dir} is empty but {sink.location} already holds batches of "
                f"pipeline {pipeline.name!r} up to batch {last.batch_id}{offsets}: the checkpoint was lost; "
                f"rebuild it from the sinks' records (`streamproof checkpoint recover {pipeline._source_name}`), "
                "restore a backup, or write to a new sink"
            )


def holds_batch(sink: Sink, batch: Batch) -> bool:
    """Whether the sink already holds ``batch`` keyed (a replay); raise if it holds that id with other offsets.

    Same batch id with different end offsets means the checkpoint is not the one the sink was written
    with: writing would mix two histories, so it is a precise error, never a guess.
    """
    for commit in sink.commits():
        if commit.batch_id != batch.batch_id or not commit.keyed:
            continue
        if commit.end_offsets is not None and commit.end_offsets != batch.end_offsets:
            raise PipelineError(
                f"{sink.location} holds batch {batch.batch_id} of pipeline {batch.pipeline!r} with end offsets "
                f"{json.dumps(commit.end_offsets)} but the checkpoint logs {json.dumps(batch.end_offsets)}: "
                "the checkpoint does not belong to this sink; restore the right one"
            )
        return True
    return False
