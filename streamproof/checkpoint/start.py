"""What a run's start reads once, before any check: the guarantee's wiring, the batches in the checkpoint's offset
and commit logs, and the quarantine table. Every check of the start (:func:`streamproof.checkpoint.log.check_readable`,
:func:`streamproof.checkpoint.positions.refuse_if_source_behind` and ``refuse_if_sink_behind``,
:func:`streamproof.checkpoint.recover.refuse_if_checkpoint_lost`), and the replay of the batches the sinks hold beyond
the checkpoint (``held_beyond``), decide on this one reading: each listed both logs again before (a LIST each on
HDFS or S3), and derived the wiring anew. Nothing writes the logs in between: the run lock is held, and a warm-up
writes only scratch copies.

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

from streamproof.checkpoint.log import Logs, read_logs
from streamproof.config import DeltaSinkSpec, PipelineSpec
from streamproof.guarantees import Wiring
from streamproof.sinks.delta import DeltaSink

QUARANTINE = "quarantine"  # the quarantine table's name where it stands beside the sinks


@dataclass(frozen=True)
class StartingPoint:
    """The checkpoint as a run's start found it (:func:`starting_point`)."""

    wiring: Wiring
    logs: Logs
    quarantine: DeltaSink  # the start's checks only: the batch writer keeps its own (a write caches what it read)


def starting_point(spec: PipelineSpec) -> StartingPoint:
    """Read what every check of a run's start decides on, once (see the module's example)."""
    quarantine = quarantine_table(spec)
    logs = read_logs(spec.checkpoint_dir)
    return StartingPoint(spec.wiring, logs, quarantine)


def quarantine_table(spec: PipelineSpec) -> DeltaSink:
    """The quarantine table, read as the keyed Delta append it is (its commits carry the batch like a sink's).

    >>> quarantine_table(spec).location                          # doctest: +SKIP
    '/data/orders_quarantine'
    """
    return DeltaSink(spec, DeltaSinkSpec(kind="delta", label=QUARANTINE, path=str(spec.quarantine_path)))
