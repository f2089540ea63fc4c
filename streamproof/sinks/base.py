"""What every sink implements, and how a batch is described to it.

Idempotency rule shared by all sinks (DESIGN.md, layer 3): under exactly-once a sink writes a batch
*keyed* on (pipeline, batch id) in the same atomic step as the data (Delta SetTransaction, PostgreSQL
ledger row, Kafka commit marker, Spark's file-sink log), so a batch that Spark replays after a crash
writes nothing the second time. Every keyed commit also records the batch's source end offsets
(:meth:`Batch.commit_record`), so a lost checkpoint is detected instead of silently replayed
(:func:`streamproof.checkpoint.recover.refuse_if_checkpoint_lost`), and a replay of a batch id with other
offsets is a precise error (:func:`holds_batch`).

Example (a sink used from your own ``foreachBatch``)::

    >>> from streamproof.sinks import open_sink
    >>> sink = open_sink(spec, spec.sink_specs[0])                                   # doctest: +SKIP
    >>> sink.write(rows, Batch("orders", batch_id, end_offsets, keyed=True))         # doctest: +SKIP
    SinkWrite(rows_out=99900, replay_skipped=False)
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import AnySinkSpec, PipelineSpec
from streamproof.errors import PipelineError

Offsets = dict[str, dict[str, int]]


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
    # Crash harness only: the fault a sink writing from Python tasks meets at its mid-write point
    # (``mid-sink-write``: the pipeline is killed; ``speculation``: the first attempt is held back).
    task_fault: str | None = None

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

    @property
    def name(self) -> str:
        """The sink's label in progress lines and reports."""
        return self.spec.name

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the rows go, for messages (a path, ``postgresql://.../table``, ``kafka://topic``); no secret."""

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
        assert spec.folder is not None, "a folder sink's spec names its folder"
        self.path = pipeline.resolve_path(spec.folder)

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def data_files_folder(self) -> Path | None:
        return None if self.path.is_remote else self.path.path


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
