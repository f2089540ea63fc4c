"""Kafka source: Spark's Kafka connector, with the record coordinates (topic, partition, offset) kept.

The connector replays a batch exactly from the offset range Spark logged in the checkpoint before the
batch ran, which is what makes the source half of exactly-once hold.

Example::

    >>> stream = read_stream(spark, spec.source)          # doctest: +SKIP
    >>> stream.columns[:3]                                 # doctest: +SKIP
    ['key', 'value', 'topic']
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import KafkaSource


def read_stream(spark: SparkSession, source: KafkaSource, *, starting_offsets: str | None = None) -> DataFrame:
    """A streaming DataFrame over the topic (Spark's Kafka columns: key, value, topic, partition, offset...).

    ``starting_offsets`` overrides the file's (at-most-once restarts from its own progress).
    """
    reader = spark.readStream.format("kafka")
    options = source.spark_options()
    if starting_offsets is not None:
        options["startingOffsets"] = starting_offsets
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def read_batch(spark: SparkSession, source: KafkaSource) -> DataFrame:
    """Every committed record of the topic, earliest to latest, read with ``read_committed``.

    Used by verification: aborted transactional records are not part of the source's truth.
    """
    options = {
        key: value
        for key, value in source.spark_options().items()
        if key not in ("startingOffsets", "maxOffsetsPerTrigger", "minPartitions")
    }
    options.update({"startingOffsets": "earliest", "endingOffsets": "latest"})
    options["kafka.isolation.level"] = "read_committed"
    reader = spark.read.format("kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()
