"""The independent checker's cut: the checkpoint read as text by its own code (Spark's offset and commit logs, the
at-most-once progress file), and each source record told read or not yet read against its bounds and what a sink
and the quarantine table hold, in plain Python (the rules: :mod:`streamproof.reconcile.read_through`).
:mod:`streamproof.reconcile.cut` is the Spark checker's.

Example::

    >>> cut = ReadThrough.of({"t": {"0": 2}}, {"t": {"0": 4}})
    >>> source = [SourceRecord(("t", 0, i), True) for i in range(5)]
    >>> read, unread = split_read(source, cut, quarantine=[], held=[("t", 0, 0), ("t", 0, 1), ("t", 0, 2)])
    >>> [record.at[2] for record in read], unread
    ([0, 1, 2], Unread(rows=2, records=2))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from streamproof.config import KafkaSource, PipelineSpec
from streamproof.errors import PipelineError
from streamproof.reconcile.counts import Counts
from streamproof.reconcile.pure import Coordinates, SourceRecord
from streamproof.reconcile.read_through import NOT_OFFSETS, Partition, ReadThrough, Unread, with_unread
from streamproof.reconcile.stored import StoredFolder

PROGRESS = "_streamproof_progress.json"  # at-most-once's progress in the checkpoint: {"end_offsets": {...}, ...}


def offset_log(checkpoint: StoredFolder, batch_id: int) -> tuple[int, dict[str, dict[str, int]]]:
    """(batchWatermarkMs, end offsets of the first source) of one entry of Spark's offset log."""
    lines = checkpoint.read_text(f"offsets/{batch_id}").splitlines()
    return int(json.loads(lines[1]).get("batchWatermarkMs", 0)), json.loads(lines[2])


def batch_ids(checkpoint: StoredFolder, log: str) -> list[int]:
    return sorted(int(name) for name in checkpoint.names(log) if name.isdigit())


def closed_through_ms(spec: PipelineSpec) -> int:
    """The watermark of the last committed batch (Spark's commit log): windows ending at or before it are written.

    >>> closed_through_ms(spec)                                                           # doctest: +SKIP
    1767225720000
    """
    checkpoint = StoredFolder.at(spec.checkpoint_dir, "the checkpoint", spec.spark.conf)
    committed = batch_ids(checkpoint, "commits")
    return offset_log(checkpoint, committed[-1])[0] if committed else 0


def read_through(spec: PipelineSpec) -> ReadThrough:
    """The bounds of the pipeline's checkpoint (read before the source): the end offsets of its last committed and
    last logged batch; at-most-once, the progress file's for both (Spark's logs are wiped at each start, and a batch
    is marked there before it is written).

    >>> read_through(spec).to_json()                                                       # doctest: +SKIP
    {'orders': {'0': {'committed': 5000, 'planned': 10000}}}
    """
    if not isinstance(spec.source, KafkaSource):
        return ReadThrough(no_cut=NOT_OFFSETS.format(kind=spec.source.kind))
    checkpoint = StoredFolder.at(spec.checkpoint_dir, "the checkpoint", spec.spark.conf)
    try:
        if spec.wiring.progress_before_write:
            marked = PROGRESS in checkpoint.names()
            ends = json.loads(checkpoint.read_text(PROGRESS))["end_offsets"] if marked else None
            return ReadThrough.of(ends, ends)
        logged, committed = batch_ids(checkpoint, "offsets"), batch_ids(checkpoint, "commits")
        watermark, planned = offset_log(checkpoint, logged[-1]) if logged else (0, None)
        return ReadThrough.of(offset_log(checkpoint, committed[-1])[1] if committed else None, planned, watermark)
    except (OSError, ValueError, KeyError, IndexError, PipelineError) as error:
        return ReadThrough(
            no_cut=f"the checkpoint cannot be read ({error}), so every record is checked to the source's end"
        )


def sink_position(cut: ReadThrough, held: Iterable[Sequence[Any]]) -> dict[Partition, int]:
    """Per partition, past the last record the sink's rows (their coordinates) name, never below the committed
    bound: the records below it were read (a sink of dedup keys or of each key's latest record names only some).

    >>> sink_position(ReadThrough.of({"t": {"0": 5, "1": 5}}, None), [("t", 0, 7), ("t", 1, 2), (None, None, None)])
    {('t', 0): 8, ('t', 1): 5}
    """
    at = dict(cut.committed)
    for topic, partition, offset in held:
        if topic is not None and partition is not None and offset is not None:
            key = (str(topic), int(partition))
            at[key] = max(at.get(key, 0), int(offset) + 1)
    return at


def split_read(
    source: Sequence[SourceRecord],
    cut: ReadThrough,
    quarantine: Iterable[Coordinates],
    held: Iterable[Sequence[Any]] | None = None,
    at: dict[Partition, int] | None = None,
) -> tuple[list[SourceRecord], Unread]:
    """The records read (to be judged as ever) and how many are not yet read. Below its partition's committed bound
    a record was read; past it, an invalid one when the quarantine holds it, and a valid (or dropped) one when below
    the sink's position ``at``, or without ``at`` when ``held`` (the sink's rows' coordinates) holds it.

    >>> resent = [SourceRecord(("t", partition, 0), True, values={"id": "e1"}) for partition in (0, 1)]
    >>> cut = ReadThrough.of({"t": {"0": 1}}, {"t": {"0": 1, "1": 1}})  # partition 1's batch not committed
    >>> [r.at for r in split_read(resent, cut, [], at=sink_position(cut, [("t", 0, 0)]))[0]]
    [('t', 0, 0)]
    """
    if cut.no_cut:
        return list(source), Unread()
    listed = {tuple(row) for row in quarantine}
    holding = {tuple(row) for row in held or ()}
    read, unread = [], set()
    rows = 0
    for record in source:
        topic, partition, offset = record.at
        committed = cut.committed_at(topic, int(partition))
        if offset < committed:
            was_read = True
        elif not record.valid and not record.dropped:  # belongs in quarantine
            was_read = record.at in listed
        elif at is not None:
            was_read = offset < at.get((topic, int(partition)), committed)
        else:
            was_read = record.valid and record.at in holding
        if was_read:
            read.append(record)
        else:
            rows += 1
            unread.add(record.at)
    return read, Unread(rows=rows, records=len(unread))


def tried(
    source: Sequence[SourceRecord],
    cut: ReadThrough,
    quarantine: Iterable[Coordinates],
    judge: Callable[[list[SourceRecord], int], Counts],
) -> Counts:
    """A sink of totals or windows, whose rows name no record: ``judge`` (given the records read, and 0 for the
    committed bounds, 1 for the planned ones, 2 for the source's end) at the committed bounds, at the planned ones,
    then at the source's end (a sink ahead of its checkpoint: an older one restored); the first counts under which
    the sink reconciles, else the committed ones.

    >>> from streamproof.reconcile.pure import check_totals
    >>> source = [SourceRecord(("t", 0, i), True, values={"c": "c1"}) for i in range(4)]
    >>> cut = ReadThrough.of({"t": {"0": 2}}, {"t": {"0": 4}})
    >>> def judge(read, _): return check_totals(read, [("c1", 4, {})], [], "c", [])
    >>> counts = tried(source, cut, [], judge)
    >>> counts.lost, counts.duplicated, counts.not_yet_read
    (0, 0, 0)
    """
    quarantine = list(quarantine)
    first = None
    for index, at in enumerate([*cut.candidates(), None]):
        read, unread = split_read(source, cut, quarantine, at=at) if at is not None else (list(source), Unread())
        counts = with_unread(judge(read, 2 if at is None else index), unread)
        if not (counts.lost or counts.duplicated or counts.unexpected):
            return counts
        first = first or counts
        if not unread.rows:  # nothing was set apart: every later candidate judges the same records
            break
    assert first is not None
    return first
