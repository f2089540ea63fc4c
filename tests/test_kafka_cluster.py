"""The Kafka sink's transactions on a cluster of three brokers (``infra up --kafka-brokers 3``: replication 3,
``min.insync.replicas = 2``, no unclean leader election), through the faults Kafka's own transaction tests are built
on: the leader of a partition being written (the marker topic's) SIGKILLed mid-transaction, the active controller
SIGKILLed, and that leader paused (SIGSTOP) longer than the cluster's session timeout, then resumed.

Each fault lands in the middle of a transaction of the sink's own writer (:class:`TransactionalWriter`, as Spark's
task runs it): its records are on the brokers, its marker and its commit not yet. Expected: the transaction commits
once, a read_committed reader counts each record once, the marker says the batch is written, and the same share run
again (a replay) writes nothing. A pipeline through the same faults, Spark and both checkers included, is the
nemesis's (``leader@``, ``controller@``, ``pause@``: docs/guarantees.md); its short run is in the slow tier. CI runs
the leader case (the 25-minute budget); ``make test-all`` runs all three.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from conftest import REPO
from streamproof.config import parse_pipeline
from streamproof.harness.daemons import Daemons, KafkaFaults
from streamproof.harness.search import replay
from streamproof.harness.sequence import parse_sequence
from streamproof.infra import KafkaCluster
from streamproof.infra.common import restartable_port
from streamproof.kafka_client import ensure_topic
from streamproof.sinks.kafka import TransactionalWriter, find_marker, wait_until_decided

pytestmark = pytest.mark.integration

COLUMNS = ("key", "value", "_src_topic", "_src_partition", "_src_offset")
ROWS = 3_000
PAUSE_S = 9.0  # longer than the cluster's broker.session.timeout.ms (6 s): the paused node is fenced
RESUMES: list[threading.Timer] = []


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    # Ports below the ephemeral range: a node SIGKILLed and started again finds its port free.
    ports = [(restartable_port(), restartable_port()) for _ in "abc"]
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), ports=ports)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down(wipe=True)


class Fault:
    """Stands for the crash harness's task fault: called once the transaction's records are flushed to the brokers,
    before its marker and its commit. Right after the fault, what every task of the sink does first (a replay's
    check) reads the marker topic's end: it must ride out the leader's move too (a run on the cluster failed there:
    FENCED_LEADER_EPOCH from the admin client, which does not retry)."""

    def __init__(self, act: Callable[[], str], sink: Any) -> None:
        self.act, self.sink, self.done = act, sink, ""

    def reached(self, index: int) -> None:
        self.done = self.act()
        wait_until_decided(self.sink)


def _committed(bootstrap_servers: str, topic: str) -> list[bytes]:
    """The values a read_committed reader finds in ``topic``'s partition 0."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"count-{time.monotonic_ns()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return values
            values.append(message.value() or b"")
    finally:
        consumer.close()
    raise AssertionError(f"reading {topic} took more than 60 s")


def _pause(cluster: KafkaCluster, topic: str) -> str:
    leader = cluster.leader_of(topic)
    pid = leader.process.pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    RESUMES.append(threading.Timer(PAUSE_S, os.kill, (pid, signal.SIGCONT)))
    RESUMES[-1].start()
    return f"node {leader.node_id} (leader of {topic}[0]) paused {PAUSE_S:.0f} s"


def _kill_leader(cluster: KafkaCluster, topic: str) -> str:
    return KafkaFaults(cluster).kill_leader(topic)  # the nemesis's own leader@ fault


def _kill_controller(cluster: KafkaCluster, topic: str) -> str:
    return KafkaFaults(cluster).kill_controller()  # the nemesis's own controller@ fault


@pytest.mark.parametrize("fault", [_kill_leader, _kill_controller, _pause], ids=["leader", "controller", "pause"])
def test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_nothing(
    kafka_cluster: KafkaCluster, tmp_path: Path, fault: Callable[[KafkaCluster, str], str]
) -> None:
    name = f"cluster-{fault.__name__.strip('_').replace('_', '-')}"
    spec = parse_pipeline(f"""
name = "{name}"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_cluster.bootstrap_servers}"
topic = "orders"
[transform]
schema = "event_id STRING"
[sink]
kind = "kafka"
bootstrap_servers = "{kafka_cluster.bootstrap_servers}"
topic = "{name}-out"
""")
    sink = spec.sink_specs[0]
    ensure_topic(kafka_cluster.bootstrap_servers, sink.topic, 1)
    ensure_topic(kafka_cluster.bootstrap_servers, sink.markers, 1, config={"cleanup.policy": "compact"})
    rows = [(f"o{n}", json.dumps({"event_id": f"e{n}"}), "orders", 0, 100 + n) for n in range(ROWS)]
    crash = Fault(lambda: fault(kafka_cluster, sink.markers), sink)
    writer = TransactionalWriter(sink, name, COLUMNS, 7, {"orders": {"0": 100 + ROWS}}, crash=crash)  # type: ignore[arg-type]

    started = time.monotonic()
    assert list(writer(0, iter(rows))) == [(0, ROWS, False)]
    print(f"{crash.done}: the transaction committed {time.monotonic() - started:.1f} s after it began")
    assert crash.done
    values = _committed(kafka_cluster.bootstrap_servers, sink.topic)
    assert len(values) == len(set(values)) == ROWS
    marker = find_marker(sink, name, 7, "orders/0@100")
    assert marker is not None and marker["source_ranges"] == {"orders/0": [100, 100 + ROWS - 1, ROWS]}

    for resume in RESUMES:  # the paused node resumed (a zombie leader until it learns it was fenced)
        resume.join()
    kafka_cluster.up()  # the killed node back
    kafka_cluster.wait_in_sync()  # every replica back in sync before the next fault
    if fault is _kill_leader:
        # The replay's check right as the marker topic's leader dies: the admin client then answered offset -1001
        # without an error, taken for the topic's end, so the marker looked unwritten (the share written again).
        _kill_leader(kafka_cluster, sink.markers)
        assert find_marker(sink, name, 7, "orders/0@100") == marker
    replay = TransactionalWriter(sink, name, COLUMNS, 7, {"orders": {"0": 100 + ROWS}})
    assert list(replay(0, iter(rows))) == [(0, 0, True)]
    kafka_cluster.up()
    assert len(_committed(kafka_cluster.bootstrap_servers, sink.topic)) == ROWS
    kafka_cluster.wait_in_sync()


@pytest.mark.crash
def test_a_pipeline_on_the_cluster_rides_out_each_node_fault_and_every_sink_reconciles(
    kafka_cluster: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    """examples/orders_on_kafka_cluster.toml (a Kafka sink and a Delta MERGE sink, both on the cluster's records)
    through the nemesis's node faults, each while a run's next batch writes: its Kafka sink's leader SIGKILLed, the
    active controller SIGKILLed, the leader paused past the session timeout; then the MERGE table OPTIMIZEd and
    VACUUMed beside a run, a SIGKILL of the pipeline itself, and a drain. Expected: every run exits 0 (or is killed),
    and both checkers find every sink 0/0/0."""
    pipeline_file = tmp_path / "pipeline.toml"
    servers = kafka_cluster.bootstrap_servers
    text = (REPO / "examples" / "orders_on_kafka_cluster.toml").read_text()
    pipeline_file.write_text(text.replace("127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096", servers))
    lines: list[str] = []
    sequence = parse_sequence("data=40,leader@1,controller@1,pause@1,optimize@1,kill@1:0.5")
    daemons = Daemons(kafka_cluster)
    outcome = replay(
        pipeline_file, sequence, spark=spark, workdir=tmp_path / "nemesis", daemons=daemons, emit=lines.append
    )
    print("\n".join(lines))
    assert outcome.failure is None, "\n".join(lines)
    said = "\n".join(lines)
    assert "SIGKILLed" in said and "the active controller" in said and "paused 9 s" in said
    assert "OPTIMIZE and VACUUM beside the run (delta: " in said
    assert "every sink 0/0/0, both checkers agree" in said


def test_a_state_folder_keeps_its_kafka_shape_and_says_how_to_change_it(tmp_path: Path) -> None:
    """No JVM: ``infra up`` after ``infra up --kafka-brokers 3`` uses the cluster; asking one broker of it, or a
    cluster of a single broker's folder, is one line naming the way out."""
    from streamproof.cli.infra import kafka_of
    from streamproof.errors import InfraError

    cluster = KafkaCluster(tmp_path / "a", brokers=3, port=19092, controller_port=19093)
    cluster._check_shape()  # what `up` records before it starts a node
    found = kafka_of(tmp_path / "a", None)
    assert isinstance(found, KafkaCluster) and found.bootstrap_servers == cluster.bootstrap_servers
    with pytest.raises(InfraError, match=r"a Kafka cluster of 3 brokers: `streamproof infra up --kafka-brokers 3`"):
        kafka_of(tmp_path / "a", 1)
    with pytest.raises(InfraError, match=r"holds a Kafka cluster on ports"):
        KafkaCluster(tmp_path / "a", brokers=3, port=29092)._check_shape()

    (tmp_path / "b" / "kafka").mkdir(parents=True)
    (tmp_path / "b" / "kafka" / "broker.json").write_text('{"port": 9092, "controller_port": 9093, "cluster_id": "x"}')
    with pytest.raises(InfraError, match=r"holds a single Kafka broker: run `streamproof infra down --wipe` first"):
        kafka_of(tmp_path / "b", 3)._check_shape()  # type: ignore[union-attr]
