"""What a run's start reads once, before any check: the guarantee's wiring, the batches in the checkpoint's offset
and commit logs, and the quarantine table (:func:`starting_point`); then what each sink holds (:func:`read_sinks`).
Every check of the start (:func:`streamproof.checkpoint.log.check_readable`,
:func:`streamproof.checkpoint.positions.refuse_if_source_behind` and ``refuse_if_sink_behind``,
:func:`streamproof.checkpoint.recover.refuse_if_checkpoint_lost`), and the replay of the batches the sinks hold beyond
the checkpoint (``held_beyond``), decide on these readings: each listed both logs again before (a LIST each on
HDFS or S3), and a young Delta table's log was listed twice, for the pipeline's newest commit and for files past it
(docs/performance.md). Nothing writes the logs in between: the run lock is held, and a warm-up writes only scratch
copies.

Example::

    >>> import tempfile
    >>> from streamproof.config import PipelineSpec
    >>> from streamproof.checkpoint.log import rebuild
    >>> spec = PipelineSpec.model_validate({"name": "orders", "checkpoint": tempfile.mkdtemp(),
    ...     "source": {"kind": "kafka", "topic": "orders"}, "transform": {"schema": "event_id STRING"},
    ...     "sink": {"kind": "delta", "path": tempfile.mkdtemp()}})
    >>> rebuild(spec.checkpoint_dir, {0: {"orders": {"0": 10}}, 1: {"orders": {"0": 25}}}, committed_through=0)
    >>> start = starting_point(spec)
    >>> start.logs, start.wiring.idempotent_sink, start.quarantine.location == str(spec.quarantine_path)
    (Logs(logged=[0, 1], committed=[0], stray_checksums=()), True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from streamproof.checkpoint.log import Logs, read_logs
from streamproof.config import DeltaSinkSpec, PipelineSpec
from streamproof.guarantees import Wiring
from streamproof.sinks.base import Sink, SinkReading
from streamproof.sinks.delta import QuarantineTable

QUARANTINE = "quarantine"  # the quarantine table's name where it stands beside the sinks


@dataclass(frozen=True)
class StartingPoint:
    """The checkpoint as a run's start found it (:func:`starting_point`)."""

    wiring: Wiring
    logs: Logs
    quarantine: QuarantineTable  # the start's checks only: the batch writer keeps its own (a write caches what it read)


def starting_point(spec: PipelineSpec) -> StartingPoint:
    """Read what every check of a run's start decides on, once (see the module's example)."""
    quarantine = quarantine_table(spec)
    logs = read_logs(spec.checkpoint_dir)
    return StartingPoint(spec.wiring, logs, quarantine)


def quarantine_table(spec: PipelineSpec) -> QuarantineTable:
    """The quarantine table, read as the keyed Delta append it is (its commits carry the batch like a sink's).

    >>> quarantine_table(spec).location                          # doctest: +SKIP
    '/data/orders_quarantine'
    """
    return QuarantineTable(spec, DeltaSinkSpec(kind="delta", label=QUARANTINE, path=str(spec.quarantine_path)))


@dataclass(frozen=True)
class SinksAtStart:
    """Every sink of a start and the quarantine table, each read once (:func:`read_sinks`): what the refusals of the
    start judge."""

    start: StartingPoint
    sinks: tuple[SinkReading, ...]
    quarantine: SinkReading

    @property
    def tables(self) -> tuple[SinkReading, ...]:
        """The sinks', then the quarantine table's reading: the order every refusal of the start names them in."""
        return (*self.sinks, self.quarantine)

    @property
    def opened(self) -> list[Sink]:
        """The sinks, as opened for the run."""
        return [reading.sink for reading in self.sinks]

    @property
    def unread(self) -> bool:
        """Whether a sink is left to read once Spark runs."""
        return not all(reading.read for reading in self.tables)


def read_sinks(
    spark: SparkSession | None, sinks: list[Sink], start: StartingPoint, earlier: SinksAtStart | None = None
) -> SinksAtStart:
    """Read each sink, and the quarantine table, once for every check of the start (:meth:`Sink.read_at_start`): an
    empty checkpoint asks what they record at all; a committed one (exactly-once) asks what they hold and what their
    storage lost; a Delta table's log is looked at for files past its last commit, whatever the guarantee. Without
    ``spark``, a sink on HDFS or an object store is left unread; ``earlier``: a reading made before Spark ran, of which
    only the unread are read now.

    >>> held = read_sinks(None, open_sinks(spec), starting_point(spec))                 # doctest: +SKIP
    >>> held.sinks[0].last_commit.get()                                                 # doctest: +SKIP
    SinkCommit(batch_id=6, end_offsets={'orders': {'0': 80}}, keyed=True, complete=True)
    """
    done = {id(reading.sink): reading for reading in earlier.tables if reading.read} if earlier is not None else {}
    exactly_once = start.wiring.idempotent_sink
    last_record, holdings = exactly_once and not start.logs.logged, exactly_once and bool(start.logs.committed)
    readings = [
        done.get(id(sink))
        or (
            SinkReading(sink, read=False)
            if spark is None and sink.needs_spark_for_commits()
            else sink.read_at_start(spark, last_record=last_record, holdings=holdings)
        )
        for sink in [*sinks, start.quarantine]
    ]
    return SinksAtStart(start, tuple(readings[:-1]), readings[-1])
