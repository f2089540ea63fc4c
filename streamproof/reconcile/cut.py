"""The Spark checker's cut: the checkpoint's bounds read through the pipeline's checkpoint module, and each source
record told read or not yet read against them and what a sink and the quarantine table hold (the rules:
:mod:`streamproof.reconcile.read_through`). :mod:`streamproof.reconcile.own_cut` is the independent checker's.

Example::

    >>> cut = read_through(load_pipeline("orders.toml"))                                  # doctest: +SKIP
    >>> read, unread = split_read(source, cut, quarantine, held=sink_rows)                 # doctest: +SKIP
    >>> unread.records                                                                     # doctest: +SKIP
    15000
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamproof.checkpoint.folder import ProgressFile
from streamproof.checkpoint.log import batch_end_offsets, batch_watermark_ms, committed_batches, logged_batches
from streamproof.config import KafkaSource, PipelineSpec
from streamproof.errors import PipelineError
from streamproof.reconcile.counts import DROPPED, VALID
from streamproof.reconcile.read_through import NOT_OFFSETS, Partition, ReadThrough, Unread
from streamproof.transform.records import COORDINATES


def read_through(spec: PipelineSpec) -> ReadThrough:
    """The bounds of the pipeline's checkpoint (read before the source): the end offsets of its last committed and
    last logged batch; at-most-once, the progress file's for both (Spark's logs are wiped at each start, and a batch
    is marked there before it is written, so no sink is ahead of it).

    >>> read_through(load_pipeline("orders.toml")).to_json()                               # doctest: +SKIP
    {'orders': {'0': {'committed': 5000, 'planned': 10000}}}
    """
    if not isinstance(spec.source, KafkaSource):
        return ReadThrough(no_cut=NOT_OFFSETS.format(kind=spec.source.kind))
    checkpoint = spec.checkpoint_dir
    try:
        if spec.wiring.progress_before_write:
            marked = ProgressFile(checkpoint).starting_offsets()
            ends = json.loads(marked) if marked is not None else None
            return ReadThrough.of(ends, ends)
        logged, committed = logged_batches(checkpoint), committed_batches(checkpoint)
        return ReadThrough.of(
            batch_end_offsets(checkpoint, committed[-1]) if committed else None,
            batch_end_offsets(checkpoint, logged[-1]) if logged else None,
            batch_watermark_ms(checkpoint, logged[-1]) if logged else 0,
        )
    except PipelineError as error:
        return ReadThrough(
            no_cut=f"the checkpoint cannot be read ({error}), so every record is checked to the source's end"
        )


def has_rows(frame: DataFrame | None) -> bool:
    return frame is not None and not frame.isEmpty()


def sink_position(cut: ReadThrough, held: DataFrame | None) -> dict[Partition, int]:
    """Per partition, past the last record the sink's rows name, never below the committed bound: the records below
    it were read (a sink of dedup keys or of each key's latest record names only some of them)."""
    at = dict(cut.committed)
    if held is None:
        return at
    last = held.groupBy("_src_topic", "_src_partition").agg(F.max("_src_offset").alias("_last"))
    for topic, partition, offset in last.collect():
        if topic is not None and partition is not None and offset is not None:
            key = (str(topic), int(partition))
            at[key] = max(at.get(key, 0), int(offset) + 1)
    return at


def _coordinates(frame: DataFrame, like: DataFrame) -> DataFrame:
    """``frame``'s distinct coordinates, typed as ``like``'s (the source's), to be joined on."""
    return frame.select(*(F.col(c).cast(like.schema[c].dataType).alias(c) for c in COORDINATES)).distinct()


def split_read(
    source: DataFrame,
    cut: ReadThrough,
    quarantine: DataFrame,
    held: DataFrame | None = None,
    at: dict[Partition, int] | None = None,
) -> tuple[DataFrame, Unread]:
    """The records read (to be judged as ever) and how many are not yet read. Below its partition's committed bound
    a record was read; past it, an invalid one when the quarantine holds it, and a valid (or dropped) one when below
    the sink's position ``at``, or without ``at`` when ``held`` (the sink's rows, by coordinates) holds it. Without a
    record past the committed bounds (a drained pipeline) ``source`` comes back as it is."""
    if cut.no_cut:
        return source, Unread()
    coordinates = list(COORDINATES)
    rows = [
        (t, p, cut.committed_at(t, p), (at or {}).get((t, p), cut.committed_at(t, p)))
        for t, p in sorted({*cut.committed, *(at or {})})
    ]
    schema = "_c_topic STRING, _c_partition INT, _c_committed LONG, _c_at LONG"
    bounds = F.broadcast(source.sparkSession.createDataFrame(rows, schema))
    on = (F.col("_src_topic") == F.col("_c_topic")) & (F.col("_src_partition") == F.col("_c_partition"))
    joined = source.join(bounds, on, "left")
    past = F.col("_src_offset") >= F.coalesce(F.col("_c_committed"), F.lit(0))
    beyond = joined.where(past)
    if beyond.isEmpty():
        return source, Unread()
    listed = _coordinates(quarantine, source).withColumn("_c_listed", F.lit(True))
    beyond = beyond.join(listed, coordinates, "left")
    if at is None:
        holding = _coordinates(held if held is not None else source.limit(0), source).withColumn("_c_held", F.lit(True))
        beyond = beyond.join(holding, coordinates, "left")
        delivered = F.col(VALID) & F.col("_c_held").isNotNull()
    else:
        delivered = F.col("_src_offset") < F.coalesce(F.col("_c_at"), F.lit(0))
    dropped = F.col(DROPPED) if DROPPED in source.columns else F.lit(False)
    judged = beyond.withColumn(
        "_c_read", F.when(~F.col(VALID) & ~dropped, F.col("_c_listed").isNotNull()).otherwise(delivered)
    )
    unread = judged.where(~F.col("_c_read"))
    counted = Unread(rows=unread.count(), records=unread.select(*coordinates).distinct().count())
    helpers = [c for c in judged.columns if c.startswith("_c_")]
    below = joined.where(~past).drop(*(c for c in joined.columns if c.startswith("_c_")))
    return below.unionByName(judged.where(F.col("_c_read")).drop(*helpers)), counted
