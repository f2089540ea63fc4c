"""Replayable sources: each yields a DataFrame carrying the source coordinates of every record.

All give Kafka-shaped rows (``topic``, ``partition``, ``offset``, ``timestamp``, ``value``), the coordinates of a
record: a Kafka record's own, a file's path and line (:mod:`streamproof.sources.files`), or a Delta table row's
(:mod:`streamproof.sources.delta`: the Kafka coordinates a bronze table carries).

Example::

    >>> stream = read_stream(spark, spec)                      # doctest: +SKIP
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import DeltaSource, FilesSource, PipelineSpec
from streamproof.kafka_client import require_topic
from streamproof.sources import delta, files, kafka


def require_available(spec: PipelineSpec) -> None:
    """Fail in one line when the source is not there (no topic, no folder, no table)."""
    if isinstance(spec.source, FilesSource):
        files.require_folder(spec)
    elif isinstance(spec.source, DeltaSource):
        delta.require_table(spec)
    else:
        require_topic(spec.source)


def read_stream(spark: SparkSession, spec: PipelineSpec, *, starting_offsets: str | None = None) -> DataFrame:
    """The pipeline's source as a stream (``starting_offsets``: Kafka only, at-most-once restarts)."""
    if isinstance(spec.source, FilesSource):
        return files.read_stream(spark, spec)
    if isinstance(spec.source, DeltaSource):
        return delta.read_stream(spark, spec)
    return kafka.read_stream(spark, spec.source, starting_offsets=starting_offsets)


def read_batch(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """Everything the source holds now, as verification reads it."""
    if isinstance(spec.source, FilesSource):
        return files.read_batch(spark, spec)
    if isinstance(spec.source, DeltaSource):
        return delta.read_batch(spark, spec)
    return kafka.read_batch(spark, spec.source)
