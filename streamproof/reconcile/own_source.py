"""The source's records as the independent checker reads them, without Spark: a Kafka topic with
``confluent-kafka`` (read_committed, every partition to its end), a Delta table or its change data feed with
delta-rs; each record parsed and validated by :mod:`streamproof.reconcile.own_schema`.

A Delta source's records get the coordinates the rules of docs/sources.md give them, written here from those rules:
the Kafka coordinates a table streamproof wrote carries (``_src_topic``, ``_src_partition``, ``_src_offset``), or
the ``[source] coordinates`` columns' values as compact JSON; a change of the feed other than an insert gets
``@v<version, 20 digits>:<change type>`` after its topic; a delete is not a deliverable record (it is quarantined
as ``deleted_upstream``); an ``update_preimage`` is not a record.

Example::

    >>> read_source(spec, RecordSchema.parse(spec.transform.schema_))[0].at                 # doctest: +SKIP
    ('orders', 0, 0)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deltalake import DeltaTable

from streamproof.config import COORDINATES, DeltaSource, KafkaSource, PipelineSpec
from streamproof.errors import ConfigError, PipelineError
from streamproof.kafka_client import source_client_config, watermarks
from streamproof.reconcile.own_schema import AvroReader, RecordSchema
from streamproof.reconcile.pure import SourceRecord
from streamproof.reconcile.stored import StoredFolder
from streamproof.transform.avro import avro_contract

# Columns of a Delta source that are not the record's data: its coordinates and the change feed's bookkeeping.
_NOT_DATA = {*COORDINATES, "_src_timestamp", "_change_type", "_commit_version", "_commit_timestamp"}


def consume_topic(config: dict[str, Any], topic: str) -> Iterator[tuple[int, int, bytes | None]]:
    """Every committed record of ``topic`` as (partition, offset, value), each partition read to its end.

    >>> sum(1 for _ in consume_topic({"bootstrap.servers": "127.0.0.1:9092"}, "orders"))   # doctest: +SKIP
    1000000
    """
    consumer = Consumer(
        {
            **config,
            "group.id": "streamproof-independent",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        except KafkaException:
            raise PipelineError(
                f"cannot reach Kafka at {config.get('bootstrap.servers')} within 30 s to read {topic}: start it with "
                "`streamproof infra up` or fix the pipeline file's bootstrap_servers"
            ) from None
        if metadata is None or metadata.error is not None:
            return
        partitions = sorted(metadata.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_partitions = set(partitions)
        for partition in partitions:  # an empty partition sends no end-of-partition event
            low, high = watermarks(consumer, TopicPartition(topic, partition))
            if high <= low:
                open_partitions.discard(partition)
        idle = 0
        while open_partitions:
            messages = consumer.consume(num_messages=50_000, timeout=1.0)
            idle = 0 if messages else idle + 1
            if idle > 60:
                raise ConfigError(f"topic {topic}: partitions {sorted(open_partitions)} not read to their end in 60 s")
            for message in messages:
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(message.partition())
                elif error is not None:
                    raise ConfigError(f"topic {topic}: {error.str()}")
                else:
                    yield int(message.partition() or 0), int(message.offset() or 0), message.value()
    finally:
        consumer.close()


def first_offsets_held(spec: PipelineSpec) -> dict[tuple[str, int], int]:
    """The partitions of a Kafka source whose first offset still held is above 0 (retention deleted the records
    before it), with that offset, as the broker reports its watermarks.

    >>> first_offsets_held(spec)                                                        # doctest: +SKIP
    {('orders', 0): 1200}
    """
    if not isinstance(spec.source, KafkaSource):
        return {}
    topic = spec.source.topic
    consumer = Consumer({**source_client_config(spec.source), "group.id": "streamproof-independent"})
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return {}
        lows = {p: watermarks(consumer, TopicPartition(topic, p))[0] for p in metadata.partitions}
    finally:
        consumer.close()
    return {(topic, p): low for p, low in sorted(lows.items()) if low > 0}


def read_source(spec: PipelineSpec, schema: RecordSchema) -> list[SourceRecord]:
    """One :class:`SourceRecord` per record of the source (a topic's committed records, or a Delta table's rows or
    changes), parsed by the pipeline file's schema.

    >>> read_source(spec, RecordSchema.parse(spec.transform.schema_))[0].at                 # doctest: +SKIP
    ('orders', 0, 0)
    """
    if isinstance(spec.source, DeltaSource):
        return _read_delta_source(spec, spec.source, schema)
    if spec.source.kind != "kafka":
        raise ConfigError(
            f"verify --independent reads Kafka and Delta sources, not {spec.source.kind}: use `streamproof verify`"
        )
    contract = avro_contract(spec)
    read = schema.read if contract is None else AvroReader(schema, contract)
    topic = spec.source.topic
    records = []
    for partition, offset, value in consume_topic(source_client_config(spec.source), topic):
        values, reason = read(value)
        records.append(SourceRecord((topic, partition, offset), reason is None, values=values))
    return records


def _read_delta_source(spec: PipelineSpec, source: DeltaSource, schema: RecordSchema) -> list[SourceRecord]:
    if spec.transform.watermark is not None:
        raise ConfigError(
            "verify --independent recomputes late records from a Kafka source's offsets only, and this pipeline "
            "reads a Delta table with a watermark: use `streamproof verify`"
        )
    folder = StoredFolder.at(spec.resolve_path(source.path), "source.path", spec.spark.conf)
    if not folder.is_dir("_delta_log"):
        raise PipelineError(f"source.path: {folder.uri} is not a Delta table (no _delta_log folder)")
    table = DeltaTable(folder.uri, storage_options=folder.storage_options or None)
    if source.read_change_feed:
        changes = table.load_cdf(starting_version=source.starting_version or 0)
        rows = pa.RecordBatchReader.from_stream(changes).read_all().to_pylist()
    else:
        rows = table.to_pyarrow_table().to_pylist()
    records = []
    for row in rows:
        change = row.get("_change_type", "insert")
        if change == "update_preimage":
            continue
        if source.coordinates:
            named = {column: row[column] for column in source.coordinates if row[column] is not None}
            at: tuple[Any, ...] = (json.dumps(named, separators=(",", ":"), default=str), 0, 0)
        else:
            at = tuple(row[column] for column in COORDINATES)
        if change != "insert":
            at = (f"{at[0]}@v{row['_commit_version']:020d}:{change}", *at[1:])
        values, reason = schema.check({name: value for name, value in row.items() if name not in _NOT_DATA})
        records.append(SourceRecord(at, reason is None and change != "delete", values=values))
    return records
