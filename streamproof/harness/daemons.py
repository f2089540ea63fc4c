"""The servers a nemesis may fault, and only those streamproof started (``infra up``, or a test's fixtures): the Kafka
broker and PostgreSQL (stopped for some seconds), a Kafka cluster's nodes (a partition's leader or the active
controller SIGKILLed, a leader paused), a Spark cluster's machines, and the S3 server, which the nemesis
reaches through a :class:`~streamproof.infra.fault_proxy.FaultProxy` so that it can also throttle it (``503
SlowDown``) and reset its connections, as S3 itself does.

Example::

    >>> Daemons().restartable()
    []
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from streamproof.config import DeltaSinkSpec, PipelineSpec, PostgresSinkSpec
from streamproof.errors import retrying_delta_conflicts
from streamproof.harness.cluster import ClusterFaults, cluster_faults
from streamproof.infra import KafkaBroker, KafkaCluster, PostgresServer, S3Server
from streamproof.infra.fault_proxy import FaultProxy
from streamproof.infra.kafka import KafkaExitedWhileStarting
from streamproof.sinks.delta_log import commits_on_disk, latest_version
from streamproof.storage.location import Location

S3_ENDPOINT = "spark.hadoop.fs.s3a.endpoint"


@dataclass
class S3Faults:
    """The S3 server and the fault proxy the nemesis's pipelines reach it through."""

    server: S3Server
    proxy: FaultProxy = field(init=False)

    def __post_init__(self) -> None:
        self.proxy = FaultProxy(("127.0.0.1", self.server.port))

    def kill(self) -> None:
        """SIGKILL the server (its data stays on disk), as a machine lost mid-write; :meth:`restart` brings it back."""
        pid = self.server.process.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.server.process.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self) -> None:
        self.server.up()

    def abandon_next_commit(self, table: Location) -> str:
        """A multipart upload of the Delta table's next commit file, begun and abandoned: what was done, in words."""
        key = f"{str(table).split('://', 1)[1]}/_delta_log/{latest_version(table) + 1:020d}.json"
        upload = self.abandon_multipart_upload(key)
        return f"multipart upload {upload[:12]}... of {key.rsplit('/', 1)[1]} begun and abandoned"

    def abandon_multipart_upload(self, key: str) -> str:
        """Begin a multipart upload of ``key`` in the bucket, send one part, and never complete it (a writer that died
        in a large upload): the upload's id. The key must stay absent: a part uploaded is no object."""
        status, body = self.server.exchange("POST", f"/{key}?uploads")
        if status != 200 or b"<UploadId>" not in body:
            raise RuntimeError(f"S3 refused to begin a multipart upload of {key}: {status} {body[:200]!r}")
        upload = body.split(b"<UploadId>", 1)[1].split(b"</UploadId>", 1)[0].decode()
        status, body = self.server.exchange("PUT", f"/{key}?partNumber=1&uploadId={upload}", b"{" * 1024)
        if status != 200:
            raise RuntimeError(f"S3 refused a part of {key}: {status} {body[:200]!r}")
        return upload


@dataclass
class KafkaFaults:
    """The faults of a Kafka cluster's nodes (``infra up --kafka-brokers 3``), each said in words as it happens."""

    cluster: KafkaCluster

    def kill_leader(self, topic: str) -> str:
        """SIGKILL the node leading ``topic``'s partition 0 (its writes in flight move to the new leader)."""
        leader = self.cluster.leader_of(topic)
        leader.process.kill()
        return f"node {leader.node_id}, leader of {topic}[0], SIGKILLed"

    def kill_controller(self) -> str:
        """SIGKILL the node leading the KRaft quorum (waiting out an election in progress, at most 30 s)."""
        deadline = time.monotonic() + 30
        while (controller := self.cluster.active_controller()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if controller is None:
            return "no active controller within 30 s: nothing killed"
        controller.process.kill()
        return f"node {controller.node_id}, the active controller, SIGKILLed"

    def pause_leader(self, topic: str, seconds: float) -> str:
        """SIGSTOP the node leading ``topic``'s partition 0 for ``seconds`` (longer than the cluster's session timeout:
        it is fenced and its partitions led elsewhere), then SIGCONT: it comes back believing it leads."""
        leader = self.cluster.leader_of(topic)
        pid = leader.process.pid()
        if pid is None:
            return f"node {leader.node_id} not running: nothing paused"
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        return f"node {leader.node_id}, leader of {topic}[0], paused {seconds:.0f} s"

    def restore(self) -> str:
        """Every node running again and every replica back in sync (the next fault meets a whole cluster); what a
        node's supervisor had to do, in words ("" when nothing: :func:`kafka_up_supervised`)."""
        said = kafka_up_supervised(self.cluster)
        self.cluster.wait_in_sync(timeout_s=120)
        return said


SUPERVISED_STARTS = 3


def kafka_up_supervised(kafka: KafkaBroker | KafkaCluster) -> str:
    """``kafka.up()``, a node that exits while starting started again, as its supervisor would (systemd's
    ``Restart=on-failure``), three starts in all; what was done, in words ("" when the first start took).

    A broker that cannot register with the controller quorum within ``initial.broker.registration.timeout.ms``
    (60 s) exits by Kafka's design. Seen once in a nemesis on this machine's two cores: a node SIGKILLed, back 3 s
    later, while the quorum elected a new controller every 5 s for a minute; started again, it joined in 3 s.

    >>> kafka_up_supervised(cluster)   # doctest: +SKIP
    ''
    """
    exits = []
    for start in range(1, SUPERVISED_STARTS + 1):
        try:
            kafka.up()
            break
        except KafkaExitedWhileStarting as exited:
            if start == SUPERVISED_STARTS:
                raise
            exits.append(str(exited).splitlines()[0])
    return f"{'; '.join(exits)}: started again, as a supervisor would" if exits else ""


@dataclass
class Daemons:
    """The servers the nemesis may fault: only those streamproof started (``infra up``, or a test's fixtures)."""

    broker: KafkaBroker | KafkaCluster | None = None
    postgres: PostgresServer | None = None
    cluster: ClusterFaults | None = None  # a Spark cluster's Workers and HDFS (``infra up --spark-workers --hdfs``)
    s3: S3Faults | None = None  # the S3 server of the pipeline's s3a:// paths (``infra up --s3``)

    @property
    def kafka_cluster(self) -> KafkaFaults | None:
        """The faults of the nodes, when the broker is a cluster."""
        return KafkaFaults(self.broker) if isinstance(self.broker, KafkaCluster) else None

    @classmethod
    def started_under(cls, state_dir: Path, spec: PipelineSpec) -> Daemons:
        """The servers of ``streamproof infra up`` under ``state_dir`` that the pipeline uses."""
        broker: KafkaBroker | KafkaCluster | None = KafkaCluster.started_under(state_dir)
        saved = state_dir / "kafka" / "broker.json"
        if broker is None and saved.exists():
            ports = json.loads(saved.read_text())
            broker = KafkaBroker(state_dir, port=int(ports["port"]), controller_port=int(ports["controller_port"]))
        uses = getattr(spec.source, "bootstrap_servers", "").split(",")
        if broker is not None and not (broker.running() and set(broker.bootstrap_servers.split(",")) & set(uses)):
            broker = None
        server = PostgresServer(state_dir)
        ports = {sink.port for sink in spec.sink_specs if isinstance(sink, PostgresSinkSpec)}
        postgres = server if server.home.exists() and server.running() and server.port in ports else None
        on_cluster = not spec.spark.master.startswith("local")
        s3 = S3Server(state_dir)
        on_s3 = any(location.scheme == "s3a" for location in spec.locations)
        ours = s3.process.pid() is not None and spec.spark.conf.get(S3_ENDPOINT, "").rstrip("/") == s3.endpoint
        return cls(
            broker,
            postgres,
            cluster_faults(state_dir) if on_cluster else None,
            S3Faults(s3) if on_s3 and ours else None,
        )

    def restartable(self) -> list[str]:
        """The servers' names, as the nemesis announces them."""
        kafka = f"Kafka ({self.broker.brokers} brokers)" if isinstance(self.broker, KafkaCluster) else "Kafka"
        named = ((kafka, self.broker), ("PostgreSQL", self.postgres), ("S3", self.s3))
        return [name for name, daemon in named if daemon is not None]

    def through_proxy(self, spec: PipelineSpec) -> PipelineSpec:
        """``spec`` with its S3 endpoint moved to the fault proxy (unchanged without an S3 server to fault)."""
        if self.s3 is None:
            return spec
        conf = {**spec.spark.conf, S3_ENDPOINT: self.s3.proxy.endpoint}
        return spec.model_copy(update={"spark": spec.spark.model_copy(update={"conf": conf})})


def maintain_delta_tables(spark: SparkSession, spec: PipelineSpec) -> str:
    """OPTIMIZE, then VACUUM (its default retention), each Delta sink table of ``spec``, as another writer's nightly
    maintenance beside the stream does; what was done, in words. An OPTIMIZE that a MERGE of the pipeline beat to
    the commit is retried, as a maintenance job does (Delta's conflict: nothing was committed)."""
    done = []
    for sink in spec.sink_specs:
        if isinstance(sink, DeltaSinkSpec):
            compacted = retrying_delta_conflicts(partial(_optimized, spark, str(sink.path)))
            spark.sql(f"VACUUM delta.`{sink.path}`").collect()
            done.append(f"{sink.name}: {compacted['numFilesRemoved']} files into {compacted['numFilesAdded']}")
    return f"OPTIMIZE and VACUUM beside the run ({'; '.join(done)})"


def _optimized(spark: SparkSession, path: str) -> Any:
    """OPTIMIZE's metrics row of the table at ``path``."""
    return spark.sql(f"OPTIMIZE delta.`{path}`").collect()[0]["metrics"]


def restore_behind(spark: SparkSession, table: Location, pipeline: str, batches: int) -> tuple[str, bool]:
    """Another writer's ``RESTORE TABLE`` of ``table`` to the version before ``pipeline``'s ``batches``-th newest
    commit in effect (undoing that many of its batches): what was done, in words, and whether it restored.

    >>> restore_behind(spark, Location("/data/orders"), "orders", 2)                   # doctest: +SKIP
    ('/data/orders: RESTOREd to version 6 by another writer', True)
    """
    commits = commits_on_disk(table, pipeline)
    if len(commits) < batches:
        return f"{table}: {len(commits)} commit(s) of the pipeline in effect, none restored away", False
    version = int(commits[-batches]["version"]) - 1
    if version < 0:
        return f"{table}: its first commit is the pipeline's: nothing before it to restore to", False
    spark.sql(f"RESTORE TABLE delta.`{table}` TO VERSION AS OF {version}").collect()
    return f"{table}: RESTOREd to version {version} by another writer", True
