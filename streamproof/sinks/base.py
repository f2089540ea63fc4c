"""What every sink implements, how a batch is described to it, and the one replay rule all sinks follow.

Idempotency rule shared by all sinks (DESIGN.md, layer 3): under exactly-once a sink writes a batch
*keyed* on (pipeline, batch id) in the same atomic step as the data (Delta SetTransaction, PostgreSQL
ledger row, Kafka commit marker, Spark's file-sink log), and records with it the batch's source end offsets
(:meth:`Batch.commit_record`).

**The replay rule** (:func:`replay_decision`), stated once: whether a keyed batch is written or skipped is
decided from what that sink durably holds, for every batch of a run, never from an assumption about which batch
of a run can be a replay. A sink reads what it holds once per run (:meth:`Sink.held_from`: only the batches from
the run's first one), then carries it batch by batch (:meth:`Sink.note_written`):

* a batch the sink holds, with the same end offsets (and the batch before it ending where this one starts): a
  replay, skipped, however many batches the sink is ahead of the checkpoint (a restored older backup);
* a batch the sink holds with other offsets: a precise error naming the batch and both offsets, never a write;
* a batch above every batch the sink holds: written;
* a batch below one the sink holds but not held itself: a precise error (the first run of that batch did not
  write here, so this one differs from it).

A batch held in part by a sink that commits per task (PostgreSQL, Kafka: :mod:`streamproof.sinks.shares`) is
written share by share, and each share is decided in its task by the same rule for shares (:func:`share_decision`),
on the record the sink keeps of it (:class:`ShareRecord`: a ledger row, a commit marker):

* no record of the share: written (its record committed with it);
* this batch's record of the share, with the replay's source ranges (or none recorded): a replay, skipped;
* this batch's record of the share with other source ranges: a precise error, never a write;
* a later batch's record of the same source partition (a compacted marker topic keeps only the newest): skipped
  when the share's rows lie below that batch's, a precise error otherwise.

A lost checkpoint is detected instead of silently replayed
(:func:`streamproof.checkpoint.recover.refuse_if_checkpoint_lost`). Proven by
``tests/test_sink_idempotency.py`` (the three cases per sink), ``tests/test_replay_rule.py`` (the rule's cases
without Spark) and
``tests/test_replay_through.py`` (an older checkpoint backup restored, as an operator does it).

Example (a sink used from your own ``foreachBatch``)::

    >>> from streamproof.sinks import open_sink
    >>> sink = open_sink(spec, spec.sink_specs[0])                                   # doctest: +SKIP
    >>> sink.write(rows, Batch("orders", batch_id, end_offsets, keyed=True))         # doctest: +SKIP
    SinkWrite(rows_out=99900, replay_skipped=False)
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from streamproof.config import AnySinkSpec, PipelineSpec
from streamproof.errors import PipelineError

Offsets = dict[str, dict[str, int]]
T = TypeVar("T")


@dataclass(frozen=True)
class Batch:
    """One micro-batch as a sink sees it.

    >>> Batch("orders", 3, {"orders": {"0": 120}}, keyed=True).commit_metadata()
    '{"streamproof": {"pipeline": "orders", "batch_id": 3, "end_offsets": {"orders": {"0": 120}}}}'
    """

    pipeline: str
    batch_id: int
    end_offsets: Offsets  # in the key order of Spark's offset log (it decides the partition numbering)
    keyed: bool  # exactly-once: key the write on (pipeline, batch id) so that a replay is skipped
    rows: int = 0  # valid rows in the batch (counted once, before the writes)
    # Where the batch starts: the end offsets of the batch before it in the checkpoint (None: the first batch, or a
    # log that no longer holds the one before). A sink holding that batch checks it ended there.
    start_offsets: Offsets | None = None
    # Crash harness only: the fault a sink writing from Python tasks meets at its mid-write point
    # (``mid-sink-write``: the pipeline is killed; ``speculation``: the first attempt is held back).
    task_fault: str | None = None
    # Records of the batch bound for the quarantine table (None: not counted). Recorded with the commit, so that a
    # batch a sink holds is known to need nothing more of the quarantine table (a restored checkpoint passing it by).
    quarantined: int | None = None

    def commit_record(self) -> dict[str, Any]:
        """What every commit of the batch records beside the data (Delta userMetadata, ledger, marker)."""
        record: dict[str, Any] = {"pipeline": self.pipeline, "batch_id": self.batch_id, "end_offsets": self.end_offsets}
        if self.start_offsets is not None:  # where the batch before it ended, for when no sink holds that one
            record["start_offsets"] = self.start_offsets
        return record if self.quarantined is None else {**record, "quarantined": self.quarantined}

    def commit_metadata(self) -> str:
        # Key order kept as Spark logged it: a rebuilt checkpoint must list partitions in the same order.
        return json.dumps({"streamproof": self.commit_record()})


@dataclass(frozen=True)
class SinkWrite:
    """What a sink did with a batch."""

    rows_out: int
    replay_skipped: bool = False  # a replayed batch the sink already held: nothing was written
    # Your own sink: the moments its write went through (streamproof.your_code.steps), and the durable steps it took in
    # other threads, which no crash can land after; None for the sinks streamproof writes itself.
    moments: tuple[str, ...] | None = None
    unseen: tuple[str, ...] = ()


@dataclass(frozen=True)
class SinkCommit:
    """A batch of this pipeline that the sink holds, as recorded in the sink itself."""

    batch_id: int
    end_offsets: Offsets | None  # None where the sink's log does not record offsets
    keyed: bool  # written with the batch key (so a replay of it is skipped)
    complete: bool = True  # False: only some partitions of the batch committed (per-partition sinks)
    quarantined: int | None = None  # the batch's records bound for quarantine, where the commit records them
    start_offsets: Offsets | None = None  # where the batch started, where the commit records it


class Sink(ABC):
    """A destination of a pipeline. Subclasses live in :mod:`streamproof.sinks` (delta, postgres, kafka, files)."""

    kind: ClassVar[str]
    # Whether an unkeyed write becomes visible in parts before it completes (PostgreSQL commits per task,
    # a plain Kafka producer): a kill mid-write then leaves part of the batch behind.
    partial_writes_visible: ClassVar[bool] = False
    # Whether the sink writes from PySpark's Python tasks (so its mid-write crash point is inside them).
    writes_in_python_tasks: ClassVar[bool] = False
    # What :meth:`head` counts, for the line that stops a run whose sink went backwards.
    head_meaning: ClassVar[str] = ""
    # Whether the sink records the batches it holds (every built-in one does): the start checks, the replay-through
    # and the checkpoint's repairs read those records.
    keeps_batch_records: ClassVar[bool] = True
    # Whether its records say which batches it was handed rather than what it holds (your own sink, kind = "python":
    # streamproof.sinks.handed): never "behind" the checkpoint on them, and every batch is handed to it.
    records_hand_outs: ClassVar[bool] = False

    def __init__(self, pipeline: PipelineSpec, spec: AnySinkSpec) -> None:
        self.pipeline = pipeline
        self.spec = spec
        self._held: HeldBatches | None = None  # what the sink holds from this run's first batch on (carried)
        # The schema of the rows a pipeline with your own transform writes (streamproof.your_code.transform), known once
        # Spark applied it; None: the record schema (with its derived columns) says.
        self.rows_schema: StructType | None = None

    def replay_check(self, batch: Batch) -> bool:
        """Whether the sink holds ``batch`` already, so that writing it again would duplicate it (a replay, to skip):
        :func:`replay_decision` on what the sink holds, read once per run (:meth:`held_from`) and carried. Raises
        :class:`PipelineError` when the batch differs from the one the sink holds. Every keyed batch is checked.

        >>> sink.replay_check(Batch("orders", 7, {"orders": {"0": 90}}, keyed=True))    # doctest: +SKIP
        False
        """
        if not batch.keyed:
            return False
        if self._held is None:
            held = self.held_from(batch.batch_id - 1)
            self._held = HeldBatches(held, known_from=self.known_from(held))
        return replay_decision(self._held, batch, self.location)

    def held_in_part(self, batch: Batch) -> bool:
        """After :meth:`replay_check`: whether the sink holds some shares of ``batch`` but not all (a sink committing
        per task, killed in its write)."""
        commit = self._held.commits.get(batch.batch_id) if self._held is not None else None
        return commit is not None and not commit.complete

    def known_from(self, held: dict[int, SinkCommit]) -> int | None:
        """The oldest batch the sink can vouch for among ``held`` (None: every batch it ever held is in its records).
        A sink whose records of old batches go away says where they still start.

        >>> sink.known_from({4: commit, 5: commit})                                        # doctest: +SKIP
        4
        """
        return None

    def note_written(self, batch: Batch) -> None:
        """Carry a batch this run committed to the sink (it now holds it), so the next decision needs no read."""
        if batch.keyed and self._held is not None:
            self._held.add(SinkCommit(batch.batch_id, batch.end_offsets, keyed=True))

    def forget_held(self) -> None:
        """Read what the sink holds again at the next batch (a write failed: it may have committed before failing)."""
        self._held = None

    def held_from(self, first_batch: int) -> dict[int, SinkCommit]:
        """This pipeline's batches with ids ``>= first_batch`` that the sink holds, read from the sink itself. The
        default reads :meth:`commits`; a sink whose log grows with its age reads only the newest part.

        >>> sink.held_from(6)                                                             # doctest: +SKIP
        {6: SinkCommit(batch_id=6, end_offsets={'orders': {'0': 80}}, keyed=True, complete=True)}
        """
        return {commit.batch_id: commit for commit in self.commits() if commit.batch_id >= first_batch}

    def head(self) -> int | None:
        """A number that only grows while the sink takes batches (a Delta table's latest version, the last batch
        of a ledger or of a file sink's log), read after each write and before the next: lower the second time,
        the sink's storage went backwards while the pipeline ran. None where the sink keeps none (unkeyed writes).

        >>> open_sinks(spec)[0].head()                     # doctest: +SKIP
        12
        """
        return None

    def storage_lost(self) -> str | None:
        """What the sink's storage lost that its own commit records cannot show (they survived, the data did
        not), as the rest of a line after the sink's name; None when nothing is known lost.

        >>> open_sinks(spec)[0].storage_lost() is None          # doctest: +SKIP
        True
        """
        return None

    def other_writers(self) -> list[str]:
        """Changes to the sink's rows that other processes committed (a Delta table's other writers), for
        ``verify`` to name beside its counts; empty where the sink cannot tell.

        >>> sink.other_writers()                                                            # doctest: +SKIP
        ['version 4 WRITE', 'version 6 DELETE']
        """
        return []

    def why_behind(self) -> str | None:
        """What made the sink hold fewer batches than the checkpoint committed, when its records tell (read by its
        last :meth:`last_commit`), as the rest of a sentence; None when they do not.

        >>> sink.why_behind()                                                               # doctest: +SKIP
        'a RESTORE committed as version 5 brought it back to version 1, undoing versions 2-4'
        """
        return None

    @property
    def name(self) -> str:
        """The sink's label in progress lines and reports."""
        return self.spec.name

    @property
    def called(self) -> str:
        """What a message calls it: ``sink <name>``; the quarantine table's own words
        (:class:`~streamproof.sinks.delta.QuarantineTable`), whatever a sink is labelled.

        >>> open_sinks(spec)[0].called                                                     # doctest: +SKIP
        'sink delta'
        """
        return f"sink {self.name}"

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the rows go, for messages (a path, ``postgresql://.../table``, ``kafka://topic``); no secret."""

    @property
    def data_files_folder(self) -> Path | None:
        """The local folder a write creates its data files in (Delta, Parquet), for the crash harness."""
        return None

    def refuse_unfit(self, spark: SparkSession) -> None:  # noqa: B027 - optional hook
        """Refuse, in one line, a table that stands and cannot take the pipeline's rows as its file lays them out (a
        Delta table partitioned otherwise, a PostgreSQL table without some columns). Asked of every sink before any
        is prepared (:func:`streamproof.pipeline.batches.open_batch_path`), so that a refusal leaves nothing made.

        >>> open_sinks(spec)[0].refuse_unfit(spark)                                        # doctest: +SKIP
        """

    def prepare(self, spark: SparkSession) -> None:  # noqa: B027 - optional hook
        """Create what the sink needs (table, topic) before the first batch; idempotent."""

    def fence(self, holder: str) -> None:  # noqa: B027 - optional hook
        """Claim the sink for the run holding the run lock's lease ``holder`` (``RunLock.holder_id``), after
        :meth:`prepare` and before the run's first write: a store that can refuse an older holder's writes refuses
        them from then on (PostgreSQL: :meth:`streamproof.sinks.postgres.PostgresSink.fence`; Kafka's producer epoch
        fences on the first batch by itself). "" (no lease): nothing to claim.

        >>> open_sinks(spec)[0].fence(lock.holder_id)                                       # doctest: +SKIP
        """

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
        """Whether reading the sink's commits needs a Spark session (a folder sink on HDFS or an object store)."""
        return False

    def last_commit(self, spark: SparkSession | None) -> SinkCommit | None:
        """The last batch the sink holds completely."""
        complete = [commit for commit in self.commits() if commit.complete]
        return complete[-1] if complete else None

    def last_record(self, spark: SparkSession | None) -> SinkCommit | None:
        """The last batch the sink records at all (completely, or, for your own sink, handed to it): a checkpoint that
        is empty while this exists was lost."""
        return self.last_commit(spark)

    def read_at_start(self, spark: SparkSession | None, *, last_record: bool, holdings: bool) -> SinkReading:
        """What the checks of a run's start ask of the sink, each read once: ``last_record`` (an empty checkpoint:
        the last batch it records at all), ``holdings`` (a committed one: the last batch it holds, why it holds
        fewer, what its storage lost). A read that fails keeps its error (:class:`Answer`).

        >>> sink.read_at_start(None, last_record=False, holdings=True).last_commit.get()  # doctest: +SKIP
        SinkCommit(batch_id=6, end_offsets={'orders': {'0': 80}}, keyed=True, complete=True)
        """
        records = self.keeps_batch_records
        recorded = Answer.of(lambda: self.last_record(spark)) if last_record and records else None
        lost = Answer.of(self.storage_lost) if holdings else None
        # Your own sink's records say what it was handed: whether it holds it, only your code knows.
        holds = (
            Answer.of(lambda: self.last_commit(spark)) if holdings and records and not self.records_hand_outs else None
        )
        why = self.why_behind() if holds is not None and holds.error is None else None
        return SinkReading(self, True, recorded, lost, holds, why)


@dataclass(frozen=True)
class Answer(Generic[T]):
    """One read of a sink: what it answered, or the error it raised. The error is raised where a check uses the
    answer, so that the checks of a start refuse in their own order whichever read failed first (a damaged record of
    one sink never hides that another says the checkpoint was lost)."""

    value: T | None = None
    error: Exception | None = None

    def get(self) -> T | None:
        """The answer, or the read's error raised.

        >>> Answer(3).get(), Answer(error=ValueError("torn")).value
        (3, None)
        """
        if self.error is not None:
            raise self.error
        return self.value

    def sure(self) -> T:
        """The answer of a read that always answers something, or the read's error raised."""
        value = self.get()
        assert value is not None, "a read that always answers answered nothing"
        return value

    @classmethod
    def of(cls, read: Callable[[], T | None]) -> Answer[T]:
        """Read now, keeping the error, if any, for :meth:`get`.

        >>> Answer.of(lambda: 1 // 0).error
        ZeroDivisionError('integer division or modulo by zero')
        """
        try:
            return cls(read())
        except Exception as error:  # noqa: BLE001 - kept, and raised where a check uses the answer
            return cls(error=error)


@dataclass(frozen=True)
class SinkReading:
    """What a run's start read of one sink or of the quarantine table (:meth:`Sink.read_at_start`), each read made once
    and only where a check of this start uses it (None: not asked)."""

    sink: Sink
    read: bool = True  # False: reached through Spark's JVM only, and no session ran yet
    last_record: Answer[SinkCommit] | None = None  # an empty checkpoint: the last batch the sink records at all
    storage_lost: Answer[str] | None = None  # what its storage lost that its records cannot show
    last_commit: Answer[SinkCommit] | None = None  # the last batch it holds completely
    why_behind: str | None = None  # what its records say made it hold fewer batches, read with last_commit
    stranded: Answer[Any] | None = None  # a Delta log: files of versions past its last commit (LogPastItsCommits)

    @property
    def holds_through(self) -> int:
        """The last batch the sink holds completely (-1: none), or the error its read raised."""
        head = self.last_commit.get() if self.last_commit is not None else None
        return head.batch_id if head is not None else -1


class FolderSink(Sink):
    """A sink that writes data files under a path of the pipeline file (Delta table, Parquet folder)."""

    def __init__(self, pipeline: PipelineSpec, spec: AnySinkSpec) -> None:
        super().__init__(pipeline, spec)
        assert spec.folder is not None, "a folder sink's spec names its folder"
        self.path = pipeline.resolve_path(spec.folder)

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def data_files_folder(self) -> Path | None:
        return None if self.path.is_remote else self.path.path

    def needs_spark_for_commits(self) -> bool:
        return self.path.is_remote  # its log (Delta's, Spark's _spark_metadata) is read through Hadoop, in Spark's JVM


def recording(sinks: list[Sink]) -> list[Sink]:
    """The sinks that record the batches they hold (:attr:`Sink.keeps_batch_records`): what the checkpoint's checks
    and repairs compare with."""
    return [sink for sink in sinks if sink.keeps_batch_records]


@dataclass
class HeldBatches:
    """What a sink holds of a pipeline, as far as a run's decisions need it: its keyed batches from the batch
    before the run's first one, by id (read once, then carried), and the highest batch it holds.

    >>> held = HeldBatches({3: SinkCommit(3, {"t": {"0": 30}}, True)})
    >>> held.through, held.add(SinkCommit(4, {"t": {"0": 40}}, True)), held.through
    (3, None, 4)
    """

    commits: dict[int, SinkCommit]
    through: int = -1
    # The oldest batch the sink can still vouch for (None: all it ever held): a sink whose records of old batches go
    # away (Kafka's compacted marker topic) cannot tell whether it holds a batch older than that.
    known_from: int | None = None

    def __post_init__(self) -> None:
        self.commits = {batch: commit for batch, commit in self.commits.items() if commit.keyed}
        self.through = max([self.through, *self.commits], default=-1)

    def add(self, commit: SinkCommit) -> None:
        if commit.keyed:
            self.commits[commit.batch_id] = commit
            self.through = max(self.through, commit.batch_id)


def replay_decision(held: HeldBatches, batch: Batch, where: str) -> bool:
    """The replay rule (module docstring): True when ``held`` holds ``batch`` completely with the same offsets (a
    replay: write nothing); False when the batch is to be written (new, or held only in part by a sink that commits
    per task, whose tasks decide each share by :func:`share_decision`); :class:`PipelineError` when writing or
    skipping it would mix two histories.

    >>> held = HeldBatches({4: SinkCommit(4, {"t": {"0": 40}}, True), 5: SinkCommit(5, {"t": {"0": 50}}, True)})
    >>> replay_decision(held, Batch("p", 5, {"t": {"0": 50}}, True, start_offsets={"t": {"0": 40}}), "/data/t")
    True
    >>> replay_decision(held, Batch("p", 6, {"t": {"0": 60}}, True, start_offsets={"t": {"0": 50}}), "/data/t")
    False
    >>> try:
    ...     replay_decision(held, Batch("p", 5, {"t": {"0": 55}}, True), "/data/t")
    ... except PipelineError as refused:
    ...     print(str(refused)[:95])
    /data/t holds batch 5 of pipeline 'p' with end offsets {"t": {"0": 50}} but the checkpoint logs
    """
    commit = held.commits.get(batch.batch_id)
    before = held.commits.get(batch.batch_id - 1)
    if commit is not None and commit.end_offsets is None:
        raise PipelineError(
            f"{where} holds batch {batch.batch_id} of pipeline {batch.pipeline!r} without the source offsets it was "
            f"written with (a Parquet folder keeps them for its newest {OFFSETS_KEPT} batches only, as Spark's offset "
            "log does; or the batch was written before streamproof recorded them), so this replay of it cannot be "
            f"checked: {TOO_OLD_REPAIR}"
        )
    if commit is not None and commit.end_offsets != batch.end_offsets:
        raise PipelineError(
            f"{where} holds batch {batch.batch_id} of pipeline {batch.pipeline!r} with end offsets "
            f"{json.dumps(commit.end_offsets)} but the checkpoint logs {json.dumps(batch.end_offsets)} for it: the "
            f"checkpoint is not the one the sink was written with{_REPAIR}"
        )
    if (
        before is not None
        and before.end_offsets is not None
        and batch.start_offsets is not None
        and before.end_offsets != batch.start_offsets
    ):
        raise PipelineError(
            f"{where} holds batch {batch.batch_id - 1} of pipeline {batch.pipeline!r} ending at "
            f"{json.dumps(before.end_offsets)} but the checkpoint starts batch {batch.batch_id} at "
            f"{json.dumps(batch.start_offsets)}: the checkpoint is not the one the sink was written with{_REPAIR}"
        )
    if commit is None and held.known_from is not None and batch.batch_id < held.known_from:
        raise PipelineError(
            f"{where} no longer records the batches of pipeline {batch.pipeline!r} before batch {held.known_from} "
            f"(its records of them are no longer kept: compacted away, or pruned), so whether it holds batch "
            f"{batch.batch_id} cannot be checked{_REPAIR}"
        )
    if commit is None and batch.batch_id < held.through:
        raise PipelineError(
            f"{where} holds batches of pipeline {batch.pipeline!r} up to {held.through} but not batch "
            f"{batch.batch_id}, which this run writes to it: the batch's first run wrote nothing here, so this one "
            f"differs from it (the checkpoint, the transform or the data changed since){_REPAIR}"
        )
    return commit is not None and commit.complete


@dataclass(frozen=True)
class ShareRecord:
    """What a sink that commits per task records of a share of a batch it holds (a PostgreSQL ledger row, a Kafka
    commit marker): the batch it was written in, and the source ranges it wrote (per source topic-partition: lowest
    offset, highest offset, count; None: the record does not say).

    >>> ShareRecord(4, {"t/0": [0, 38, 20]}).source_ranges["t/0"]
    [0, 38, 20]
    """

    batch_id: int
    source_ranges: dict[str, list[int]] | None


def share_decision(
    record: ShareRecord | None, batch_id: int, source_key: str, ranges: dict[str, list[int]], where: str
) -> bool:
    """The replay rule for one share of a batch (module docstring), decided in the task that holds its rows: False when
    no ``record`` of the share is found (write it); True when ``record`` holds it (a replay: write nothing), being
    this batch's record with the replay's source ``ranges`` (or none recorded), or a later batch's record of the same
    source partition whose rows lie above the replay's (a compacted marker topic keeps only the newest marker of a
    source partition, and a later batch of a partition is written only once every earlier one was);
    :class:`PipelineError` naming ``where``, the share and both ranges otherwise.

    >>> share_decision(None, 4, "t/0@0", {"t/0": [0, 38, 20]}, "pg")
    False
    >>> share_decision(ShareRecord(4, {"t/0": [0, 38, 20]}), 4, "t/0@0", {"t/0": [0, 38, 20]}, "pg")
    True
    >>> share_decision(ShareRecord(6, {"t/0": [60, 78, 10]}), 4, "t/0@0", {"t/0": [0, 38, 20]}, "marker topic m")
    True
    >>> try:
    ...     share_decision(ShareRecord(4, {"t/0": [0, 18, 10]}), 4, "t/0@0", {"t/0": [0, 38, 20]}, "pg")
    ... except PipelineError as refused:
    ...     print(str(refused)[:87])
    pg: batch 4's share t/0@0 was committed with source ranges {"t/0": [0, 18, 10]} but the
    """
    if record is None:
        return False
    if record.batch_id != batch_id:  # a later batch's: the share's own record is compacted away
        later = record.source_ranges or {}
        if all(part in later and low_high[1] < later[part][0] for part, low_high in ranges.items()):
            return True
        raise PipelineError(
            f"{where}: the marker of batch {batch_id} {source_key} is compacted away, and the replay holds "
            f"{json.dumps(ranges)}, not below batch {record.batch_id}'s {json.dumps(later)} of the same source "
            "partition: the checkpoint does not belong to this topic"
        )
    # None: the record says nothing of the share's rows (a ledger row without them, or gone since the task's claim
    # found it): trusted, the share's key having been found committed.
    if record.source_ranges is None or record.source_ranges == ranges:
        return True
    raise PipelineError(
        f"{where}: batch {batch_id}'s share {source_key} was committed with source ranges "
        f"{json.dumps(record.source_ranges)} but the replay holds {json.dumps(ranges)}: the checkpoint does not belong "
        "to this sink, the transform changed since the batch was written, or the batch is split otherwise "
        "(`min_partitions` changed since)"
    )


OFFSETS_KEPT = 100  # the newest batches whose offsets a sink without its own log of them keeps (Parquet)
# A checkpoint restored from a backup further behind a sink than the offsets it keeps: the repair, in the refusal.
TOO_OLD_REPAIR = (
    "restore a newer checkpoint backup, or put back the checkpoint `checkpoint restore` replaced "
    "(`checkpoint restore PIPELINE --from CHECKPOINT.replaced-TIME`; of several, the one that committed the newest "
    "batch), or write to a new sink"
)
_REPAIR = (
    " (a backup of another run, a checkpoint of another pipeline, or the source was read again since); nothing "
    "was written: restore the checkpoint backup the sink was written with, or move the checkpoint aside and rebuild "
    "it from the offsets the sinks recorded (`streamproof checkpoint recover PIPELINE`)"
)
