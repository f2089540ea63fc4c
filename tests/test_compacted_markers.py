"""The Kafka sink's marker topic is compacted: the newest marker per source partition is kept. A replayed share whose
own marker the cleaner removed must still be found written, by its source partition's later marker, or it is
produced again (issue 40: a restored batch looked "held in part", and that share was written twice).

Real Kafka, markers written as the sink writes them; the cleaner's work is stood for by leaving the compacted
markers out (a test with the broker's own cleaner would wait on it for its segments to close).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer

from streamproof.errors import PipelineError
from streamproof.infra import KafkaBroker
from streamproof.kafka_client import ensure_topic
from streamproof.sinks.base import share_decision
from streamproof.sinks.kafka import find_marker, marker_key, share_record
from streamproof.sinks.shares import SourceRanges

pytestmark = pytest.mark.integration

COLUMNS = ("key", "value", "_src_topic", "_src_partition", "_src_offset")


def _marker(batch_id: int, partition: int, low: int, high: int) -> dict[str, object]:
    source = f"orders/{partition}"
    return {"pipeline": "shop", "topic": "out", "batch_id": batch_id, "source": source,
            "source_key": f"{source}@{low}", "end_offsets": {"orders": {"0": 0}},
            "source_ranges": {source: [low, high, high - low + 1]}, "rows": high - low + 1}  # fmt: skip


def test_a_share_whose_marker_was_compacted_away_is_held_by_its_source_partition_s_later_marker(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from streamproof.config import parse_pipeline

    spec = parse_pipeline(f"""
name = "shop"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "orders"
[transform]
schema = "event_id STRING"
[sink]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "out"
""")
    sink = spec.sink_specs[0]
    ensure_topic(kafka_broker.bootstrap_servers, sink.markers, 1, config={"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    # What the cleaner leaves of batches 3-5 when partition 1 had rows in batch 3 and none after: the newest marker of
    # each source partition, partition 1's of batch 3 and partition 0's of batch 5 (so batch 3 looks held in part).
    for marker in (_marker(3, 1, 30, 39), _marker(5, 0, 50, 59)):
        producer.produce(sink.markers, key=marker_key("shop", "out", str(marker["source"])), value=json.dumps(marker))
    assert producer.flush(30) == 0

    assert find_marker(sink, "shop", 3, "orders/1@30")["batch_id"] == 3  # type: ignore[index]
    later = find_marker(sink, "shop", 4, "orders/0@40")  # its own is gone: partition 0's batch 5 holds it
    assert later is not None and later["batch_id"] == 5
    assert find_marker(sink, "shop", 3, "orders/0@30") == later  # batch 3's share of partition 0 likewise
    assert find_marker(sink, "shop", 4, "orders/1@40") is None  # partition 1's newest is older: not written
    assert find_marker(sink, "shop", 6, "orders/0@60") is None  # newer than every marker: not written

    # The decision the sink's task takes on what it found (TransactionalWriter): the rule for a share, on the marker.
    where = f"marker topic {sink.markers}"
    below = SourceRanges(COLUMNS)
    for offset in range(40, 50):
        below.add(("k", "v", "orders", 0, offset))
    # Its rows lie below batch 5's: held, nothing produced.
    assert share_decision(share_record(later), 4, "orders/0@40", below.as_json(), where) is True
    overlapping = SourceRanges(COLUMNS)
    for offset in range(45, 55):
        overlapping.add(("k", "v", "orders", 0, offset))
    with pytest.raises(PipelineError, match=r"the marker of batch 4 orders/0@45 is compacted away, and the replay "
                                            r"holds .* not below batch 5's"):  # fmt: skip
        share_decision(share_record(later), 4, "orders/0@45", overlapping.as_json(), where)


def _marker_keys_of_batch(bootstrap: str, markers: str, batch_id: int) -> list[str]:
    """The sources whose marker of ``batch_id`` the marker topic still holds (read_committed, from its start)."""
    from confluent_kafka import Consumer, TopicPartition

    from streamproof.sinks.kafka import read_markers

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-probe"})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(markers, 0), timeout=10)
    finally:
        consumer.close()
    spec = SimpleNamespace(bootstrap_servers=bootstrap, markers=markers, producer_options=dict)
    return sorted(str(m.get("source")) for _, m in read_markers(spec, 0, end) if m.get("batch_id") == batch_id)  # type: ignore[arg-type]


@pytest.mark.crash
def test_a_restored_batch_whose_marker_the_cleaner_compacted_is_not_produced_twice(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """With the broker's own cleaner: a Kafka -> Kafka pipeline of 2 source partitions runs batch 0 (both), a backup,
    batch 1 (both), batch 2 (partition 0 only). The marker topic, made to compact at once (100-ms segments, dirty ratio
    0.01, the broker's cleaner every 0.5 s), keeps partition 0's marker of batch 2 and partition 1's of batch 1: batch 1
    looks held in part. The backup restored, its replay must skip partition 0's share, whose marker is gone (before:
    it was produced again: 965 records duplicated in this test's run)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    from conftest import run_cli
    from streamproof.config import load_pipeline
    from streamproof.generator import generate
    from streamproof.reconcile import verify_pipeline

    bootstrap = kafka_broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker_id = str(admin.describe_cluster().result(30).nodes[0].id)
    cleaner = ConfigResource("BROKER", broker_id, incremental_configs=[
        ConfigEntry("log.cleaner.backoff.ms", "500", incremental_operation=AlterConfigOpType.SET)])  # fmt: skip
    for future in admin.incremental_alter_configs([cleaner]).values():
        future.result(30)
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(f"""
name = "compacted"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "compacted-in"
max_offsets_per_trigger = 10000
[transform]
schema = "event_id STRING, order_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
quarantine = "{tmp_path}/quarantine"
[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "compacted-out"
""")
    markers = "compacted-out.streamproof-markers"
    ensure_topic(bootstrap, markers, 1, config={"cleanup.policy": "compact", "segment.ms": "100",
                                                "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"})

    def run() -> None:
        done = run_cli("run", str(pipeline_file), "--available-now")
        assert done.returncode == 0, done.stderr[-2000:]

    generate(bootstrap, "compacted-in", 1_000, partitions=2, malformed=0.0, seed=41)
    run()
    backup = run_cli("checkpoint", "backup", str(pipeline_file), "--to", str(tmp_path / "backup"))
    assert backup.returncode == 0, backup.stderr[-2000:]
    generate(bootstrap, "compacted-in", 1_000, partitions=2, malformed=0.0, seed=42)
    run()
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(500):  # partition 0 only
        order = {"event_id": f"p0-{n}", "order_id": f"o{n}", "amount": 1.0, "status": "placed",
                 "event_time": "2026-11-27T00:00:00Z"}  # fmt: skip
        producer.produce("compacted-in", value=json.dumps(order), partition=0)
    assert producer.flush(30) == 0
    run()
    time.sleep(0.2)  # closes the segment of batch 2's markers: the cleaner compacts closed segments only
    producer.produce(markers, key="probe", value="{}")
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 120
    while _marker_keys_of_batch(bootstrap, markers, 1) != ["compacted-in/1"]:
        assert time.monotonic() < deadline, _marker_keys_of_batch(bootstrap, markers, 1)
        time.sleep(1)

    restored = run_cli("checkpoint", "restore", str(pipeline_file), "--from", str(tmp_path / "backup"))
    assert restored.returncode == 0, restored.stderr[-2000:]
    run()
    (report,) = verify_pipeline(spark, load_pipeline(pipeline_file))
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_json()
    assert report.source_records == 2_500
