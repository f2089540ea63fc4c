"""A task's share of a batch, for the sinks that commit per task (PostgreSQL, Kafka: :class:`ShareSink`).

Spark numbers a batch's partitions in an order that need not be the same when the batch is replayed (after a
rebuilt checkpoint it was not), so a per-task commit is keyed on what the task writes (:func:`peek_source_key`),
never on its number; :class:`SourceRanges` records what it wrote, so a replay holding other records is a
precise error (:func:`streamproof.sinks.base.share_decision`); and once every share of a batch committed, a
:data:`BATCH_COMPLETE` record says so.

Example::

    >>> ranges = SourceRanges(("_src_topic", "_src_partition", "_src_offset"))
    >>> for row in [("t", 2, 40), ("t", 2, 41)]:
    ...     ranges.add(row)
    >>> ranges.as_json(), ranges.single_source()
    ({'t/2': [40, 41, 2]}, 't/2')
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark.sql import DataFrame

from streamproof.errors import PipelineError
from streamproof.faults.in_tasks import TaskFault, task_fault
from streamproof.sinks.base import Batch, Sink, SinkWrite
from streamproof.transform.records import COORDINATES

BATCH_COMPLETE = "*"  # the source key of the record a per-partition sink writes once every partition committed


def peek_source_key(rows: Iterable[tuple[Any, ...]], columns: tuple[str, ...]) -> tuple[str | None, Iterator[Any]]:
    """The key of a task's share of a batch, by content: ``<topic>/<partition>@<first offset>`` of its first
    row, and the rows (the first one put back). ``None`` for a task without rows.

    A Kafka split holds one source partition in offset order, so the first row's coordinates name it, and two
    splits of one partition (``minPartitions``) differ by their first offset.

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


Shares = Iterable[tuple[str, dict[str, list[int]] | None]]  # (source key, source ranges) of shares, as recorded


def overlap_refusal(where: str, batch_id: int, source_key: str, ranges: SourceRanges, siblings: Shares) -> str | None:
    """Why this share may not be written (None: it may): a share of the same batch and source partition under
    another key, written before, holds some of its offsets (the batch is split otherwise than when it was written,
    and the share's key is new). A task's own guard, behind :func:`split_refusal`.

    >>> ranges = SourceRanges(("_src_topic", "_src_partition", "_src_offset"))
    >>> for offset in (20, 38):
    ...     ranges.add(("t", 0, offset))
    >>> refusal = overlap_refusal("pg", 4, "t/0@20", ranges, [("t/0@0", {"t/0": [0, 38, 20]}), ("t/1@1", None)])
    >>> refusal[:98]
    "pg: batch 4's share t/0@20 (offsets 20-38 of t/0) overlaps its share t/0@0 written before (offsets"
    >>> overlap_refusal("pg", 4, "t/0@20", ranges, [("t/0@40", {"t/0": [40, 60, 21]})]) is None
    True
    """
    others = [(key, recorded) for key, recorded in siblings if key != source_key]
    found = _first_overlap(others, [(source_key, ranges.as_json())])
    if found is None:
        return None
    _, (low, high), key, (their_low, their_high) = found
    return (
        f"{where}: batch {batch_id}'s share {source_key} (offsets {low}-{high} of {ranges.single_source()}) "
        f"overlaps its share {key} written before (offsets {their_low}-{their_high}): the batch is split otherwise "
        "than when it was written (`min_partitions` changed since?), and this share would write those records a "
        "second time; nothing of it was written: run the pipeline with the setting it had until this batch is "
        "committed"
    )


def split_refusal(
    where: str, batch_id: int, recorded: Shares, splits: Iterable[tuple[str, dict[str, list[int]]]]
) -> str | None:
    """Why a batch held in part may not be replayed with these splits (None: it may), decided on the driver before
    any task writes: a split must be a share written before (the same key and rows: held) or overlap none (new). A
    split that overlaps a share without being it means the batch is split otherwise than when it was written
    (``min_partitions`` changed since): its rows would be written a second time, or left unwritten.

    >>> held = [("t/0@0", {"t/0": [0, 38, 20]}), ("t/1@1", {"t/1": [1, 39, 20]})]
    >>> split_refusal("pg", 4, held, [("t/0@0", {"t/0": [0, 38, 20]}), ("t/1@1", {"t/1": [1, 39, 20]})]) is None
    True
    >>> split_refusal("pg", 4, held[:1], [("t/0@0", {"t/0": [0, 38, 20]}), ("t/1@1", {"t/1": [1, 39, 20]})]) is None
    True
    >>> refusal = split_refusal("pg", 4, held, [("t/0@0", {"t/0": [0, 18, 10]}), ("t/0@20", {"t/0": [20, 38, 10]})])
    >>> refusal.split(": ", 2)[2][:76]
    't/0@0 (offsets 0-18) against the share t/0@0 written before (offsets 0-38) ('
    >>> split_refusal("pg", 4, held[:1], [("t/1@1", {"t/1": [1, 19, 10]}), ("t/1@21", {"t/1": [21, 39, 10]})]) is None
    True
    """
    found = _first_overlap(recorded, splits)
    if found is None:
        return None
    key, (low, high), held_key, (held_low, held_high) = found
    return (
        f"{where}: batch {batch_id} is held in part, and its replay is split otherwise than when it was written: "
        f"{key} (offsets {low}-{high}) against the share {held_key} written before (offsets {held_low}-"
        f"{held_high}) (`min_partitions` changed since?); nothing was written: run the pipeline with the setting "
        "it had until this batch is committed"
    )


def refuse_other_splits(where: str, batch_id: int, recorded: Shares, partitions: Any, columns: tuple[str, ...]) -> None:
    """:func:`split_refusal` of a batch held in part, raised on the driver: the splits of ``partitions`` (the RDD
    of row tuples the sink's tasks will write, with ``columns``), read by one small job, against its shares."""
    refusal = split_refusal(where, batch_id, recorded, partitions.mapPartitions(split_ranges(columns)).collect())
    if refusal is not None:
        raise PipelineError(refusal)


def _first_overlap(
    recorded: Shares, splits: Iterable[tuple[str, dict[str, list[int]]]]
) -> tuple[str, tuple[int, int], str, tuple[int, int]] | None:
    """The first split that overlaps a recorded share of its source partition without being that share: the
    split's key and offsets, the share's key and offsets."""
    shares = [(key, ranges) for key, ranges in recorded if ranges]
    for key, ranges in splits:
        ((source, (low, high, _)),) = ranges.items()
        for held_key, held_ranges in shares:
            if source not in held_ranges or (held_key, held_ranges) == (key, ranges):
                continue
            held_low, held_high = held_ranges[source][0], held_ranges[source][1]
            if held_low <= high and low <= held_high:
                return key, (low, high), held_key, (held_low, held_high)
    return None


def split_ranges(
    columns: tuple[str, ...],
) -> Callable[[Iterable[tuple[Any, ...]]], Iterator[tuple[str, dict[str, list[int]]]]]:
    """A function for ``rdd.mapPartitions``: each split's key and source ranges (none for a split without rows)."""

    def ranges_of(rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[str, dict[str, list[int]]]]:
        key, rows = peek_source_key(rows, columns)
        if key is None:
            return
        ranges = SourceRanges(columns)
        for row in rows:
            ranges.add(row)
        yield key, ranges.as_json()

    return ranges_of


# What a task of a per-share sink runs on its partition: (index, rows) -> (index, rows written, skipped as a replay).
ShareWriter = Callable[[int, Iterable[tuple[Any, ...]]], Iterator[tuple[int, int, bool]]]


class ShareSink(Sink):
    """A sink that commits a batch share by share, one transaction per task (PostgreSQL, Kafka), and the keyed write
    both follow (:meth:`write`). A subclass says how its rows reach the tasks (:meth:`_share_rows`), which shares of a
    batch it records (:meth:`_recorded_shares`), what its tasks run (:meth:`_share_writer`) and how it marks a batch
    complete (:meth:`_record_batch_complete`).

    >>> sink.write(valid_rows, Batch("orders", 4, offsets, keyed=True))               # doctest: +SKIP
    SinkWrite(rows_out=16583, replay_skipped=False)
    """

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        """The replay rule on the batches the sink holds first (:meth:`replay_check`): a foreign checkpoint is
        refused before any share is written, and a batch held whole is skipped on the driver (its replay may be split
        otherwise, and a new split's key would be new). A batch held in part is checked on the driver against its
        shares (:func:`refuse_other_splits`). Then each task writes its share, or finds it recorded and skips or
        refuses it (:func:`streamproof.sinks.base.share_decision`); once all succeeded, the batch is recorded complete.
        Unkeyed, the tasks write without looking for or leaving a record (PostgreSQL; the Kafka sink gives an unkeyed
        batch to Spark's own writer instead)."""
        if self.replay_check(batch):
            return SinkWrite(0, replay_skipped=True)
        shares = self._share_rows(rows)
        columns = tuple(shares.columns)
        partitions = shares.rdd.map(tuple)
        if self.held_in_part(batch):  # its splits must be the shares written, or new: decided before any task writes
            refuse_other_splits(self.shares_where, batch.batch_id, self._recorded_shares(batch), partitions, columns)
        tasks = partitions.getNumPartitions()
        writer = self._share_writer(batch, columns, tasks, task_fault(batch.task_fault, tasks, batch.batch_id))
        results = partitions.mapPartitionsWithIndex(writer).collect()
        if batch.keyed:
            self._record_batch_complete(batch)
            self.note_written(batch)
        written = sum(count for _, count, _ in results)
        return SinkWrite(written, replay_skipped=any(skip for _, _, skip in results) and written == 0)

    @property
    @abstractmethod
    def shares_where(self) -> str:
        """The sink, as a refusal of a batch's splits names it (no secret)."""

    @abstractmethod
    def _share_rows(self, rows: DataFrame) -> DataFrame:
        """The batch's valid rows as the tasks write them (the coordinates among the columns)."""

    @abstractmethod
    def _recorded_shares(self, batch: Batch) -> Shares:
        """The shares of ``batch`` the sink records (a batch held in part), read from the sink."""

    @abstractmethod
    def _share_writer(self, batch: Batch, columns: tuple[str, ...], tasks: int, fault: TaskFault | None) -> ShareWriter:
        """What each of the batch's ``tasks`` tasks runs on its rows (``columns``), with the ``fault`` the crash harness
        armed (None: none); asked once per batch written, on the driver, before any task runs."""

    @abstractmethod
    def _record_batch_complete(self, batch: Batch) -> None:
        """Every share of the batch committed: say so in the sink (a batch without that record is partial)."""
