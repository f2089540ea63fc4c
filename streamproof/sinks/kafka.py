"""Kafka -> Kafka sink: a transactional producer per task, with a commit marker in the same transaction.

Idempotency, the mechanism (the rule, for batches and for shares, is :mod:`streamproof.sinks.base`'s; the keyed
write both per-task sinks follow is :class:`streamproof.sinks.shares.ShareSink`'s): under exactly-once, task ``i``
of a batch writes through a producer with the deterministic ``transactional.id``
``streamproof.<pipeline>.<topic>.<i>``. Its ``init_transactions`` fences any earlier producer with that id (a zombie
of a killed run) and aborts the zombie's open transaction. In one transaction it writes its share of the batch to
the output topic and a commit marker
``{pipeline, topic, batch_id, source, source_key, end_offsets, source_ranges, rows}`` to the marker topic (keyed per
source partition, compacted). The share is named by what it holds (``source_key``:
:func:`streamproof.sinks.shares.peek_source_key`), not by the task number, which a replay may not repeat. Before
writing, the task looks for the committed marker of its share with ``read_committed``:

* first write: no marker: the records and the marker commit together;
* replay: a batch held whole (its batch-complete record) is skipped on the driver; in one held in part, a share
  whose marker is there writes nothing, nor one whose marker the topic's compaction removed when a later batch's
  marker of its source partition lies above its rows (:func:`~streamproof.sinks.base.share_decision`);
* inconsistency: a marker of this share whose source ranges differ from the replayed share's is a precise error, and
  so is a later batch's marker not above them; so is a replay of a batch held in part whose splits are not the
  shares written (``min_partitions`` changed: :func:`~streamproof.sinks.shares.split_refusal`, on the driver before
  any task writes).

Once every task succeeded, a batch-complete record follows in the marker topic. Markers are trusted only
once every transaction open on the marker topic when the task started has been decided (its last stable
offset reached the high watermark seen at the start); before the first batch of a run, the driver fences
every task's id, so a zombie's transaction cannot hold that up. Readers must use
``isolation.level=read_committed`` (verification does), or they also see aborted records.

Unkeyed writes (at-least-once, at-most-once) use Spark's own Kafka writer, which is at-least-once by its
documentation: a replayed batch is produced again.

Example::

    >>> sink = KafkaSink(spec, spec.sink_specs[0])                                   # doctest: +SKIP
    >>> sink.write(valid_rows, Batch("orders", 3, end_offsets, keyed=True))          # doctest: +SKIP
    SinkWrite(rows_out=16583, replay_skipped=False)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamproof.config import KafkaSinkSpec, KafkaSource, PipelineSpec
from streamproof.errors import PipelineError
from streamproof.faults.in_tasks import TaskFault
from streamproof.kafka_client import (
    client_config,
    ensure_topic,
    require_topic,
    source_client_config,
    topic_exists,
    watermarks,
)
from streamproof.sinks.base import Batch, SinkCommit, SinkWrite, share_decision
from streamproof.sinks.markers import (  # noqa: F401 - find_marker, wait_until_decided: the sink's, its tests use
    batch_shares,
    find_marker,
    marker_key,
    read_markers,
    share_markers,
    share_record,
    wait_until_decided,
)
from streamproof.sinks.shares import (
    BATCH_COMPLETE,
    Shares,
    ShareSink,
    ShareWriter,
    SourceRanges,
    overlap_refusal,
    peek_source_key,
)
from streamproof.transform.records import COORDINATES, SOURCE_COLUMNS, record_schema

TRANSACTION_TIMEOUT_MS = "60000"


def transactional_id(pipeline: str, topic: str, partition_id: int) -> str:
    """The producer id of Spark partition ``partition_id``: the same on every attempt of it, so a restarted
    task fences its zombie.

    >>> transactional_id("orders", "orders-out", 3)
    'streamproof.orders.orders-out.3'
    """
    return f"streamproof.{pipeline}.{topic}.{partition_id}"


def _producer(spec: KafkaSinkSpec, pipeline: str, partition_id: int) -> Any:

    settings = {
        "transactional.id": transactional_id(pipeline, spec.topic, partition_id),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        **spec.producer_options(),
    }
    return Producer(client_config(spec.bootstrap_servers, **settings))


@dataclass(frozen=True)
class TransactionalWriter:
    """Writes one partition in one Kafka transaction with its marker (pickled to the executors)."""

    spec: KafkaSinkSpec
    pipeline: str
    columns: tuple[str, ...]  # key, value, then the coordinates
    batch_id: int
    end_offsets: dict[str, dict[str, int]]
    crash: TaskFault | None = None  # crash harness only

    def __call__(self, index: int, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[int, int, bool]]:
        """Write partition ``index``; yield ``(index, records written, skipped as a replay)``."""

        source_key, rows = peek_source_key(rows, self.columns)
        if source_key is None:
            yield index, 0, False  # no valid row in this split: nothing to write, nothing to record
            return
        producer = _producer(self.spec, self.pipeline, index)
        producer.init_transactions(60)  # fences a zombie with this id and aborts its open transaction
        committed, siblings = share_markers(self.spec, self.pipeline, self.batch_id, source_key)
        ranges = SourceRanges(self.columns)
        if committed is not None:  # its marker, or a later batch's of its source partition: held, or refused
            for row in rows:
                ranges.add(row)
            where = f"marker topic {self.spec.markers}"
            yield index, 0, share_decision(share_record(committed), self.batch_id, source_key, ranges.as_json(), where)
            return
        producer.begin_transaction()
        try:
            for row in rows:
                self._produce(producer, self.spec.topic, row[0], row[1])
                ranges.add(row)
            if self.crash is not None:
                producer.flush(60)  # the records are on the broker, in a transaction that will never commit
                self.crash.reached(index)
            source = ranges.single_source()
            written = [(sibling.get("source_key", ""), sibling.get("source_ranges")) for sibling in siblings]
            refusal = overlap_refusal(f"kafka topic {self.spec.topic}", self.batch_id, source_key, ranges, written)
            if refusal is not None:
                raise PipelineError(refusal)  # before the commit: the transaction is aborted below
            marker = {
                "pipeline": self.pipeline,
                "topic": self.spec.topic,
                "batch_id": self.batch_id,
                "source": source,
                "source_key": source_key,
                "end_offsets": self.end_offsets,
                "source_ranges": ranges.as_json(),
                "rows": ranges.count,
            }
            # json.dumps without sort_keys: end_offsets keep Spark's key order (see Batch).
            key = marker_key(self.pipeline, self.spec.topic, source)
            self._produce(producer, self.spec.markers, key, json.dumps(marker))
            producer.commit_transaction(60)
        except (KafkaException, PipelineError):
            # An abort that fails too (a commit still in flight, a fenced producer) must not hide what failed: the
            # transaction, never committed, is aborted by the next init_transactions of this id, or by its timeout.
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(60)
            raise
        yield index, ranges.count, False

    @staticmethod
    def _produce(producer: Any, topic: str, key: str | None, value: str) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)


class KafkaSink(ShareSink):
    """Valid records, as JSON, to a Kafka topic (see the module docstring)."""

    kind = "kafka"
    partial_writes_visible = True  # unkeyed, Spark's writer produces records as it goes
    spec: KafkaSinkSpec

    def __init__(self, pipeline: PipelineSpec, spec: KafkaSinkSpec) -> None:
        super().__init__(pipeline, spec)
        self._fenced = False
        self._recorded_ends: tuple[int, dict[str, int]] | None = None  # the last complete batch's output ends
        self._marked: list[int] = []  # every batch the marker topic still marks (read with held_from)
        self._ends_after_write: dict[str, int] | None = None
        # Transactional writes run in Python tasks; Spark's own (unkeyed) writer runs in the JVM.
        self.writes_in_python_tasks = pipeline.wiring.idempotent_sink  # type: ignore[misc]

    @property
    def location(self) -> str:
        return f"kafka://{self.spec.bootstrap_servers}/{self.spec.topic}"

    def prepare(self, spark: SparkSession) -> None:
        """Create the output topic (as many partitions as the source's) and the compacted marker topic."""
        source = self.pipeline.source
        assert isinstance(source, KafkaSource), "config refuses a Kafka sink behind a files source"
        partitions = len(require_topic(source))
        settings = {k: v for k, v in source_client_config(source).items() if k != "bootstrap.servers"}
        ensure_topic(self.spec.bootstrap_servers, self.spec.topic, partitions, client_settings=settings)
        ensure_topic(
            self.spec.bootstrap_servers,
            self.spec.markers,
            1,
            config={"cleanup.policy": "compact"},
            client_settings=settings,
        )

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        """Keyed: share by share, each task's share keyed by its marker (:meth:`ShareSink.write`; a batch held whole
        is skipped on the driver, also because a compacted marker topic keeps one marker of a source partition's
        splits). Unkeyed: Spark's own Kafka writer."""
        if batch.keyed:
            return super().write(rows, batch)
        spark_writer = _as_records(rows, self.spec.key).select("key", "value").write.format("kafka")
        for name, value in {
            "kafka.bootstrap.servers": self.spec.bootstrap_servers,
            "topic": self.spec.topic,
            **self.spec.kafka_options,
        }.items():
            spark_writer = spark_writer.option(name, value)
        spark_writer.save()
        return SinkWrite(batch.rows)

    @property
    def shares_where(self) -> str:
        return f"kafka topic {self.spec.topic}"

    def _share_rows(self, rows: DataFrame) -> DataFrame:
        return _as_records(rows, self.spec.key)

    def _recorded_shares(self, batch: Batch) -> Shares:
        return batch_shares(self.spec, batch.pipeline, batch.batch_id)

    def _share_writer(self, batch: Batch, columns: tuple[str, ...], tasks: int, fault: TaskFault | None) -> ShareWriter:
        if not self._fenced:  # the first batch of a run: no task then waits on a zombie's open transaction
            self._fence_zombies(tasks)
        return TransactionalWriter(self.spec, batch.pipeline, columns, batch.batch_id, batch.end_offsets, fault)

    def _record_batch_complete(self, batch: Batch) -> None:
        """Every share of the batch committed: say so in the marker topic (a batch without it is partial)."""

        producer = Producer(
            client_config(
                self.spec.bootstrap_servers,
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    **self.spec.producer_options(),
                },
            )
        )
        # With the output topic's ends: a later start sees a topic recreated or truncated under its markers (and
        # the run's own check before the next batch starts from them: head).
        self._ends_after_write = self._output_ends()
        record = {
            "pipeline": batch.pipeline,
            "topic": self.spec.topic,
            "batch_id": batch.batch_id,
            "source": BATCH_COMPLETE,
            "complete": True,
            "end_offsets": batch.end_offsets,
            "output_ends": self._ends_after_write,
            "quarantined": batch.quarantined,
        }
        producer.produce(
            self.spec.markers, key=marker_key(batch.pipeline, self.spec.topic, BATCH_COMPLETE), value=json.dumps(record)
        )
        if producer.flush(60):
            raise PipelineError(f"marker topic {self.spec.markers}: the batch-complete record was not acknowledged")

    def _fence_zombies(self, partitions: int) -> None:
        """Before the first batch of a run: abort what producers of a killed run left open, so that no
        task waits on another partition's zombie transaction. (In parallel: each waits on the broker.)"""

        def fence(index: int) -> None:
            _producer(self.spec, self.pipeline.name, index).init_transactions(60)

        with ThreadPoolExecutor(max_workers=min(8, max(1, partitions))) as pool:
            list(pool.map(fence, range(partitions)))
        self._fenced = True

    def held_from(self, first_batch: int) -> dict[int, SinkCommit]:
        every = self.commits()
        self._marked = [commit.batch_id for commit in every]
        return {commit.batch_id: commit for commit in every if commit.batch_id >= first_batch}

    def known_from(self, held: dict[int, SinkCommit]) -> int | None:
        """The marker topic is compacted (the newest marker per source partition is kept): once it is, the markers
        of older batches are gone, and only the unbroken run of batches up to the newest one still says what the
        topic holds. None while every batch from the first one marked is still there."""
        marked = sorted(self._marked)
        if not marked or marked == list(range(marked[0], marked[-1] + 1)):
            return None
        start = marked[-1]
        while start - 1 in marked:
            start -= 1
        return start

    def commits(self) -> list[SinkCommit]:
        """Batches with a committed marker of this pipeline and topic, oldest first; complete when the
        batch-complete record follows its shares."""

        consumer = Consumer(client_config(self.spec.bootstrap_servers, **{"group.id": "streamproof-preflight"}))
        try:
            topics = consumer.list_topics(self.spec.markers, timeout=10).topics
            if self.spec.markers not in topics or topics[self.spec.markers].error is not None:
                return []
            _, end = watermarks(consumer, TopicPartition(self.spec.markers, 0))
        finally:
            consumer.close()
        batches: dict[int, dict[str, dict[str, int]]] = {}
        complete: dict[int, int | None] = {}  # batch -> its quarantined count, as its batch-complete record says
        for _, marker in read_markers(self.spec, 0, end):
            if marker.get("pipeline") == self.pipeline.name and marker.get("topic") == self.spec.topic:
                batches[int(marker["batch_id"])] = marker["end_offsets"]
                if marker.get("complete"):
                    complete[int(marker["batch_id"])] = marker.get("quarantined")
                    if "output_ends" in marker:
                        self._recorded_ends = (int(marker["batch_id"]), marker["output_ends"])
        return [
            SinkCommit(batch_id, offsets, keyed=True, complete=batch_id in complete, quarantined=complete.get(batch_id))
            for batch_id, offsets in sorted(batches.items())
        ]

    def _output_ends(self) -> dict[str, int]:
        """The output topic's end offset per partition (missing topic: none)."""
        consumer = Consumer(
            client_config(
                self.spec.bootstrap_servers, **{**self.spec.producer_options(), "group.id": "streamproof-ends"}
            )
        )
        try:
            topic = consumer.list_topics(self.spec.topic, timeout=10).topics.get(self.spec.topic)
            if topic is None or topic.error is not None:
                return {}
            return {
                str(p): watermarks(consumer, TopicPartition(self.spec.topic, p))[1] for p in sorted(topic.partitions)
            }
        finally:
            consumer.close()

    head_meaning = "output topic's end offsets, summed over its partitions,"

    def head(self) -> int | None:
        """The output topic's end offsets, summed: they only grow while the topic takes batches (keyed writes)."""
        if not self.pipeline.wiring.idempotent_sink:
            return None
        ends, self._ends_after_write = self._ends_after_write, None  # read by the write just done
        return sum((ends if ends is not None else self._output_ends()).values())

    def storage_lost(self) -> str | None:
        """The output topic ends below where the last complete batch left it: records its markers say are written
        are gone (the topic deleted and recreated, or truncated), and a replay would skip them by those markers."""
        self._recorded_ends = None
        self.commits()
        if self._recorded_ends is None:
            return None
        batch_id, recorded = self._recorded_ends
        now = self._output_ends()
        short = {p: (now.get(p, 0), end) for p, end in recorded.items() if now.get(p, 0) < end}
        if not short:
            return None
        described = ", ".join(
            f"partition {p} ends at offset {have:,}, batch {batch_id}'s commit left it at {want:,}"
            for p, (have, want) in sorted(short.items(), key=lambda item: int(item[0]))
        )
        return (
            f"holds fewer records than its commit markers say ({described}): the topic was deleted and recreated, "
            f"or truncated, and records of batches up to {batch_id} are gone from it while the marker topic "
            f"{self.spec.markers} says they are written, so a replay would skip them; restore the topic, or write "
            "to a new topic and marker topic from a new checkpoint"
        )

    def read(self, spark: SparkSession) -> DataFrame | None:
        """The output topic as a ``read_committed`` consumer sees it, parsed back into columns."""

        if not topic_exists(self.spec.bootstrap_servers, self.spec.topic):
            return None
        reader = spark.read.format("kafka")
        options = {
            "kafka.bootstrap.servers": self.spec.bootstrap_servers,
            "subscribe": self.spec.topic,
            "startingOffsets": "earliest",
            "endingOffsets": "latest",
            **self.spec.kafka_options,
            "kafka.isolation.level": "read_committed",
        }
        for name, value in options.items():
            reader = reader.option(name, value)
        schema = self.rows_schema or record_schema(self.pipeline.transform)
        return reader.load().select(F.from_json(F.col("value").cast("string"), schema).alias("r")).select("r.*")


def _as_records(rows: DataFrame, key: str | None) -> DataFrame:
    """``key`` (the chosen column as text, or null), ``value`` (the row as JSON), then the coordinates."""

    data = [c for c in rows.columns if c not in SOURCE_COLUMNS]
    record_key = F.col(key).cast("string") if key else F.lit(None).cast("string")
    value = F.to_json(F.struct(*data, *SOURCE_COLUMNS))
    return rows.select(record_key.alias("key"), value.alias("value"), *COORDINATES)
