"""Python-side Kafka clients (confluent-kafka): their settings, and the topic questions streamproof asks outside
Spark: does the broker answer, does a topic exist (create it), where do its partitions end.

Spark's connector reads and writes the records; this module only checks and prepares, before a pipeline
starts (so that a missing topic is one line, not a stream waiting forever), and for tests and tools.

Example::

    >>> client_config("127.0.0.1:9092", **{"group.id": "g"})
    {'bootstrap.servers': '127.0.0.1:9092', 'log_level': 2, 'group.id': 'g'}
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streamproof.config import KafkaSource
from streamproof.errors import InfraError, PipelineError

CONNECT_TIMEOUT_S = 10.0


ClientConfig = dict[str, str | int | float | bool]


def client_config(bootstrap_servers: str, **settings: Any) -> ClientConfig:
    """librdkafka settings for a Python-side client.

    librdkafka's own logs are silenced up to error level: it prints them straight to stderr while it retries,
    transient ones ("coordinator load in progress") and one line per attempt to reach a broker that is down
    (580 lines before `generate` gave up on a stopped broker). Every caller turns a failed request into one
    line of its own that says what to do.
    """
    return {"bootstrap.servers": bootstrap_servers, "log_level": 2, **settings}


def source_client_config(source: KafkaSource) -> ClientConfig:
    """librdkafka settings equivalent to the source's connection options (security settings included).

    >>> source = KafkaSource(kind="kafka", topic="t", **{"kafka.security.protocol": "SSL"})
    >>> source_client_config(source)["security.protocol"]
    'SSL'
    """
    return secured_client_config(source.bootstrap_servers, source.kafka_options)


def secured_client_config(bootstrap_servers: str, kafka_options: dict[str, str]) -> ClientConfig:
    """librdkafka settings with the security settings of Spark-style ``kafka.*`` options (a source's or a sink's);
    JAAS strings are Java's, librdkafka has no use for them.

    >>> sorted(secured_client_config("b:9092", {"kafka.sasl.mechanism": "PLAIN", "kafka.sasl.jaas.config": "x"}))
    ['bootstrap.servers', 'log_level', 'sasl.mechanism']
    """
    config = client_config(bootstrap_servers)
    for key, value in kafka_options.items():
        name = key.removeprefix("kafka.")
        if name.startswith(("security.", "sasl.", "ssl.")) and "jaas" not in name:
            config[name] = value
    return config


# A partition's leader moved: a broker of a cluster killed or fenced, or leadership handed back to its preferred
# replica. The client's next request, on fresh metadata, reaches the new leader. OFFSET_NOT_AVAILABLE: a leader just
# elected whose high watermark has not caught up yet (Kafka's Java client retries it; librdkafka does not say so):
# a run of the 300-step cluster nemesis failed on it in the marker topic's offsets, five minutes after a controller
# was killed, when the brokers handed leadership back to the preferred replicas.
LEADER_MOVED = (
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
)


def leader_moved(error: KafkaException) -> bool:
    """Whether a failed request is worth asking again: its partition's leader moved, or librdkafka says retriable.

    >>> leader_moved(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
    True
    >>> leader_moved(KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE)))  # a new leader's watermark behind
    True
    >>> leader_moved(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    False
    """
    cause = error.args[0]
    return bool(cause.retriable()) or cause.code() in LEADER_MOVED


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """A partition's low and high watermarks, asked again while its leader moves (a run on a 3-broker cluster failed
    on one NOT_LEADER_FOR_PARTITION), within ``timeout_s``.

    >>> watermarks(consumer, TopicPartition("orders", 0))                               # doctest: +SKIP
    (0, 12000)
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = consumer.get_watermark_offsets(partition, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
        except KafkaException as error:
            if not leader_moved(error) or time.monotonic() > deadline:
                raise
            found = None
        if found is not None:
            return int(found[0]), int(found[1])
        if time.monotonic() > deadline:
            raise InfraError(
                f"Kafka gave no watermarks of {partition.topic}[{partition.partition}] in {timeout_s:.0f} s"
            )
        time.sleep(0.3)


Watermarks = dict[int, tuple[int, int]]  # a topic's {partition: (low, high)}


def _watermarks(consumer: Consumer, topic: str, partitions: list[int], timeout_s: float) -> Watermarks:
    return {p: watermarks(consumer, TopicPartition(topic, p), timeout_s) for p in sorted(partitions)}


def require_topic(source: KafkaSource) -> Watermarks:
    """Check the broker answers and the topic exists; return ``{partition: (low, high)}`` watermarks.

    Raises :class:`PipelineError` with what to do when the broker is down or the topic is missing,
    instead of letting Spark wait on a topic that will never appear.
    """
    consumer = Consumer(
        {**source_client_config(source), "group.id": "streamproof-preflight", "enable.auto.commit": False}
    )
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
        return _watermarks(consumer, source.topic, list(topic.partitions), CONNECT_TIMEOUT_S)
    finally:
        consumer.close()


def topic_end_offsets(bootstrap_servers: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """High watermark of every partition of ``topic`` (``KafkaException`` when the broker does not answer)."""
    consumer = Consumer(client_config(bootstrap_servers, **{"group.id": "streamproof-offsets"}))
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        return {p: high for p, (_, high) in _watermarks(consumer, topic, list(partitions), timeout_s).items()}
    finally:
        consumer.close()


def topic_exists(bootstrap_servers: str, topic: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``topic`` exists on the cluster (a clear error if the cluster does not answer)."""
    try:
        metadata = AdminClient(client_config(bootstrap_servers)).list_topics(topic, timeout=timeout_s)
    except KafkaException:
        raise PipelineError(f"cannot reach Kafka at {bootstrap_servers} within {timeout_s:.0f} s") from None
    found = metadata.topics.get(topic)
    return found is not None and found.error is None


def ensure_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    timeout_s: float = 30.0,
    config: dict[str, str] | None = None,
    client_settings: ClientConfig | None = None,
) -> int:
    """Create the topic with ``partitions`` partitions (and topic ``config``) if missing; return its
    partition count. ``client_settings`` add librdkafka settings (security) to the admin client. A broker that
    does not answer within :data:`CONNECT_TIMEOUT_S` is an :class:`InfraError`."""
    admin = AdminClient(client_config(bootstrap_servers, **(client_settings or {})))
    try:
        metadata = admin.list_topics(timeout=min(timeout_s, CONNECT_TIMEOUT_S))
    except KafkaException:
        raise InfraError(f"cannot reach Kafka at {bootstrap_servers}: start it with `streamproof infra up`") from None
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        return len(existing.partitions)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=-1, config=config or {})]  # broker default
    )
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as error:
        if "TOPIC_ALREADY_EXISTS" not in str(error):
            raise InfraError(f"cannot create topic {topic!r} on {bootstrap_servers}: {error}") from None
    return partitions
