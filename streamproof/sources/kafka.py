"""Kafka source: Spark's Kafka connector, with the record coordinates (topic, partition, offset) kept.

The connector replays a batch exactly from the offset range Spark logged in the checkpoint before the
batch ran, which is what makes the source half of exactly-once hold.

Example::

    >>> stream = read_stream(spark, spec.source)          # doctest: +SKIP
    >>> stream.columns[:3]                                 # doctest: +SKIP
    ['key', 'value', 'topic']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamproof.config import KafkaSource
from streamproof.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CONNECT_TIMEOUT_S = 10.0


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


def client_config(bootstrap_servers: str, **settings: object) -> dict[str, object]:
    """librdkafka settings for a Python-side client (confluent-kafka).

    Warnings below error level are silenced: librdkafka prints transient ones ("coordinator load in
    progress") straight to stderr while it retries, which would pollute every command's output.
    """
    return {"bootstrap.servers": bootstrap_servers, "log_level": 3, **settings}


def admin_config(source: KafkaSource) -> dict[str, object]:
    """librdkafka settings equivalent to the source's connection options (for checks outside Spark)."""
    config = client_config(source.bootstrap_servers)
    for key, value in source.kafka_options.items():
        name = key.removeprefix("kafka.")
        if name.startswith(("security.", "sasl.", "ssl.")) and "jaas" not in name:
            config[name] = value
    return config


def require_topic(source: KafkaSource) -> dict[int, tuple[int, int]]:
    """Check the broker answers and the topic exists; return ``{partition: (low, high)}`` watermarks.

    Raises :class:`PipelineError` with what to do when the broker is down or the topic is missing,
    instead of letting Spark wait on a topic that will never appear.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({**admin_config(source), "group.id": "streamproof-preflight", "enable.auto.commit": False})
    try:
        try:
            metadata = consumer.list_topics(timeout=CONNECT_TIMEOUT_S)
        except KafkaException:
            raise PipelineError(
                f"cannot reach Kafka at {source.bootstrap_servers} within {CONNECT_TIMEOUT_S:.0f} s: "
                f"start it with `streamproof infra up` or fix source.bootstrap_servers"
            ) from None
        topic = metadata.topics.get(source.topic)
        if topic is None or topic.error is not None:
            raise PipelineError(
                f"topic {source.topic!r} does not exist on {source.bootstrap_servers}: create it "
                f"(`streamproof generate --topic {source.topic} ...`) or fix source.topic"
            )
        watermarks = {}
        for partition in sorted(topic.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(source.topic, partition), timeout=CONNECT_TIMEOUT_S
            )
            watermarks[partition] = (low, high)
        return watermarks
    finally:
        consumer.close()


def topic_exists(bootstrap_servers: str, topic: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``topic`` exists on the cluster (a clear error if the cluster does not answer)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient(client_config(bootstrap_servers)).list_topics(topic, timeout=timeout_s)
    except KafkaException:
        raise PipelineError(f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:.0f} s") from None
    found = metadata.topics.get(topic)
    return found is not None and found.error is None
