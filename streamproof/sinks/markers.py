"""The Kafka sink's marker topic: one commit marker per share of a batch, written in the share's own transaction
(keyed per source partition, compacted), and a batch-complete record once every share committed
(:mod:`streamproof.sinks.kafka`). Here: reading them back, and the wait that makes them trustworthy.

A marker is trusted only once every transaction open on the marker topic when the reader started has been decided
(:func:`wait_until_decided`); markers are read with ``read_committed`` (:func:`read_markers`).

Example::

    >>> marker_key("orders", "orders-valid", "orders/3")
    'orders/orders-valid/orders/3'
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from streamproof.config import KafkaSinkSpec
from streamproof.errors import PipelineError
from streamproof.kafka_client import client_config, leader_moved
from streamproof.sinks.base import ShareRecord
from streamproof.sinks.shares import BATCH_COMPLETE

DECIDED_TIMEOUT_S = 120.0
MARKER_WINDOW = 2000


def marker_key(pipeline: str, topic: str, source: str) -> str:
    """Marker key of one source partition's shares (compaction keeps the newest per source partition)."""
    return f"{pipeline}/{topic}/{source}"


def wait_until_decided(spec: KafkaSinkSpec, timeout_s: float = DECIDED_TIMEOUT_S) -> int:
    """Wait until no transaction that was open on the marker topic when called is still open; return the
    high watermark it waited for (everything below it is committed or aborted)."""

    partition = TopicPartition(spec.markers, 0)
    deadline = time.monotonic() + timeout_s
    admin = AdminClient(client_config(spec.bootstrap_servers, **spec.producer_options()))

    def latest(level: IsolationLevel) -> int:
        nonlocal admin
        while True:
            futures = admin.list_offsets({partition: OffsetSpec.latest()}, isolation_level=level, request_timeout=5)
            try:
                offset = int(futures[partition].result().offset)
            except KafkaException as error:
                # The partition's leader moved (a broker of a cluster killed or fenced): the admin client does not
                # retry; a new one asks the new leader.
                if not leader_moved(error):
                    raise
                offset = -1
            # With the leader gone, the answer can also be no error and offset -1001 (measured on a 3-broker
            # cluster): taken for an end, it made every marker look unwritten, and a held batch was written again.
            if offset >= 0:
                return offset
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"marker topic {spec.markers}: no leader gave its end offset within {timeout_s:.0f} s; is the "
                    "Kafka cluster up?"
                )
            time.sleep(0.5)
            admin = AdminClient(client_config(spec.bootstrap_servers, **spec.producer_options()))

    high_watermark = latest(IsolationLevel.READ_UNCOMMITTED)
    while latest(IsolationLevel.READ_COMMITTED) < high_watermark:
        if time.monotonic() > deadline:
            raise PipelineError(
                f"marker topic {spec.markers}: a transaction stayed open for {timeout_s:.0f} s; a producer of "
                "another application may use it, or the broker's transaction timeout is too long"
            )
        time.sleep(0.1)
    return high_watermark


def read_markers(spec: KafkaSinkSpec, start: int, end: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Committed markers at offsets ``[start, end)`` of the marker topic (read_committed)."""

    if end <= start:
        return
    consumer = Consumer(
        client_config(
            spec.bootstrap_servers,
            **{
                **spec.producer_options(),
                "group.id": f"streamproof-markers-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,  # the markers are few and small: do not let the broker hold the fetch 500 ms
            },
        )
    )
    try:
        consumer.assign([TopicPartition(spec.markers, 0, start)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:  # the last stable offset is reached
                    return
                raise PipelineError(f"reading marker topic {spec.markers}: {error}")
            offset = int(message.offset() or 0)
            if offset >= end:
                return
            yield offset, json.loads(message.value() or b"{}")
        raise PipelineError(f"reading marker topic {spec.markers} took more than 60 s")
    finally:
        consumer.close()


def find_marker(spec: KafkaSinkSpec, pipeline: str, batch_id: int, source_key: str) -> dict[str, Any] | None:
    """The committed marker of this share of the batch (its ``source_key``), or None if it was not written
    (:func:`share_markers`, without the batch's other shares)."""
    return share_markers(spec, pipeline, batch_id, source_key)[0]


def share_markers(
    spec: KafkaSinkSpec, pipeline: str, batch_id: int, source_key: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The committed marker of this share of the batch (its ``source_key``), or None if it was not written; and the
    markers of the batch's other shares of the same source partition met on the way (a batch split otherwise).

    Reads backwards from the end in windows: the markers of one source partition come in batch order, so
    the search stops at that partition's first marker of an earlier batch. The marker topic is compacted (the newest
    marker per source partition kept): when this share's marker is gone and a later batch's marker of the same source
    partition is there, that one is returned. A later batch of a source partition is written only once every earlier
    batch was, so it proves this share written (or that it had no rows);
    :func:`~streamproof.sinks.base.share_decision` checks that the share's rows lie below the later batch's.
    """
    source = source_key.rsplit("@", 1)[0]
    end = wait_until_decided(spec)
    start = max(0, end - MARKER_WINDOW)
    later: dict[str, Any] | None = None  # the oldest marker of this source partition's later batches met so far
    siblings: list[dict[str, Any]] = []
    while True:
        window = [
            marker
            for _, marker in read_markers(spec, start, end)
            if marker.get("pipeline") == pipeline
            and marker.get("topic") == spec.topic
            and marker.get("source") == source
        ]
        for marker in reversed(window):
            if int(marker["batch_id"]) < batch_id:
                return None, siblings
            if int(marker["batch_id"]) == batch_id and marker.get("source_key") == source_key:
                return marker, siblings
            if int(marker["batch_id"]) == batch_id:
                siblings.append(marker)
            if int(marker["batch_id"]) > batch_id:
                later = marker
        if start == 0:
            return later, siblings
        end, start = start, max(0, start - 2 * (end - start))


def share_record(marker: dict[str, Any]) -> ShareRecord:
    """What a commit marker found by :func:`share_markers` records of its share, for
    :func:`~streamproof.sinks.base.share_decision`. A marker without source ranges records none (``{}``), which no
    replay's rows match: unlike a PostgreSQL ledger row without them, it is not trusted.

    >>> share_record({"batch_id": 5, "source_key": "t/0@50", "source_ranges": {"t/0": [50, 59, 10]}})
    ShareRecord(batch_id=5, source_ranges={'t/0': [50, 59, 10]})
    """
    return ShareRecord(int(marker["batch_id"]), marker.get("source_ranges") or {})


def batch_shares(spec: KafkaSinkSpec, pipeline: str, batch_id: int) -> list[tuple[str, dict[str, list[int]] | None]]:
    """The shares of ``batch_id`` whose markers the topic still holds: their keys and source ranges (a batch held in
    part, checked against its replay's splits: :func:`streamproof.sinks.shares.split_refusal`). Reads the whole topic:
    asked only of a batch a killed write left in part."""
    return [
        (str(marker.get("source_key")), marker.get("source_ranges"))
        for _, marker in read_markers(spec, 0, wait_until_decided(spec))
        if marker.get("pipeline") == pipeline
        and marker.get("topic") == spec.topic
        and int(marker.get("batch_id", -1)) == batch_id
        and marker.get("source") != BATCH_COMPLETE
    ]
