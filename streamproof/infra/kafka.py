"""A real Apache Kafka broker (KRaft, one node as broker and controller), or a cluster of them
(:class:`KafkaCluster`, ``infra up --kafka-brokers 3``), started from the cached jars.

State lives under a state folder (default ``.streamproof/``): ``kafka/data`` (log dirs, formatted once),
``kafka/server.log``, ``kafka/broker.pid`` and ``kafka/broker.json`` (ports and cluster id); a cluster's other nodes
in ``kafka-2``, ``kafka-3``, ..., and its shape in ``kafka/cluster.json``. ``up`` is
idempotent (a running broker is reused), ``down`` stops only the process ``up`` started, identified by
its pid *and* its command line, so a recycled pid is never killed.

Example::

    >>> from pathlib import Path
    >>> broker = KafkaBroker(Path(".streamproof"), port=9092)
    >>> broker.bootstrap_servers
    '127.0.0.1:9092'
    >>> broker.up()            # doctest: +SKIP
    'started Kafka (KRaft) at 127.0.0.1:9092 in 4.8 s'
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from confluent_kafka.admin import AdminClient

from streamproof.errors import InfraError, log_tail
from streamproof.infra.common import START_TIMEOUT_S, DaemonProcess, LocalDaemon, port_in_use, wiped
from streamproof.jvm.jars import check_java, kafka_broker_classpath
from streamproof.kafka_client import client_config

DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093


class KafkaExitedWhileStarting(InfraError):
    """A Kafka node's process ended before it answered: a wrong setting, or, by design, a broker that could not
    register with a controller quorum still electing within ``initial.broker.registration.timeout.ms`` (60 s)."""


SERVER_PROPERTIES = """\
# Written by streamproof infra up: KRaft node {node_id} of {nodes}, acting as broker and controller.
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
# Every topic, internal ones too, has a replica on each node up to 3; a write is acknowledged by {min_isr} of them
# (production's replication 3, min.insync.replicas 2), and a replica out of sync never becomes leader.
offsets.topic.replication.factor={replication}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replication}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={replication}
share.coordinator.state.topic.min.isr={min_isr}
default.replication.factor={replication}
min.insync.replicas={min_isr}
unclean.leader.election.enable=false
# A node that stops heartbeating (killed, paused) is fenced, and its partitions led elsewhere, after 6 s.
broker.session.timeout.ms={session_ms}
broker.heartbeat.interval.ms=1000
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
"""

LOG4J2_PROPERTIES = """\
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka_request.name = kafka.request.logger
logger.kafka_request.level = WARN
"""


@dataclass
class KafkaBroker(LocalDaemon):
    """The local broker under ``state_dir/kafka``; node ``node_id`` of a :class:`KafkaCluster` when ``voters`` names
    the cluster's controllers (its folder then ``kafka-<node_id>``, node 1's ``kafka``)."""

    folder: ClassVar[str] = "kafka"
    log_name: ClassVar[str] = "server.log"
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    node_id: int = 1
    voters: str = ""  # controller.quorum.voters of a cluster; empty: this node alone
    cluster_id: str = ""  # a cluster's, shared by its nodes; empty: drawn when the node is first formatted

    @property
    def home(self) -> Path:
        return self.state_dir / (self.folder if self.node_id == 1 else f"{self.folder}-{self.node_id}")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def process(self) -> DaemonProcess:
        """The broker's process: ours only if its command line names our config file."""
        return DaemonProcess(self.home / "broker.pid", str(self.home / "server.properties"))

    def running(self) -> bool:
        return self.process.pid() is not None

    def _answers(self, timeout_s: float = 5.0) -> bool:
        try:
            metadata = AdminClient(client_config(self.bootstrap_servers)).list_topics(timeout=timeout_s)
        except Exception:
            return False
        return bool(metadata.brokers)

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            java,
            "-Xms256m",
            "-Xmx1g",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp",
            kafka_broker_classpath(),
            main_class,
            *args,
        ]

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        settings = self.home / "broker.json"
        if settings.exists():
            saved = json.loads(settings.read_text())
            if (saved["port"], saved["controller_port"]) != (self.port, self.controller_port):
                raise InfraError(
                    f"{self.home} was formatted for port {saved['port']}: run `streamproof infra down --wipe` "
                    f"first, or use --state-dir for a second broker"
                )
        else:
            settings.write_text(
                json.dumps(
                    {
                        "port": self.port,
                        "controller_port": self.controller_port,
                        "cluster_id": self.cluster_id or _cluster_id(),
                    }
                )
            )
        nodes = self.voters.count("@") or 1
        replication = min(nodes, 3)
        (self.home / "server.properties").write_text(
            SERVER_PROPERTIES.format(
                node_id=self.node_id,
                nodes=nodes,
                voters=self.voters or f"{self.node_id}@127.0.0.1:{self.controller_port}",
                port=self.port,
                controller_port=self.controller_port,
                data_dir=self.home / "data",
                replication=replication,
                min_isr=min(replication, 2),
                session_ms=9000 if nodes == 1 else 6000,
            )
        )
        (self.home / "log4j2.properties").write_text(LOG4J2_PROPERTIES.format(log_file=self.log_file))

    def _format_storage_once(self) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = json.loads((self.home / "broker.json").read_text())["cluster_id"]
        done = subprocess.run(
            self._java_command(
                "kafka.tools.StorageTool",
                "format",
                "--ignore-formatted",
                # One argument with "=": a random id starts with "-" one time in 64, and as a separate argument
                # StorageTool's parser then takes it for an option and fails ("expected one argument").
                f"--cluster-id={cluster_id}",
                "-c",
                str(self.home / "server.properties"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise InfraError(f"formatting Kafka storage in {self.home / 'data'} failed:\n{done.stderr[-2000:]}")

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the broker if it is not running; wait until it answers. Returns a status line."""
        if self.running() and self._answers():
            return f"Kafka already running at {self.bootstrap_servers} (pid {self.process.pid()})"
        started = time.monotonic()
        self.wait_answering(self.start_unless_running(), started + timeout_s)
        return f"started Kafka (KRaft) at {self.bootstrap_servers} in {time.monotonic() - started:.1f} s"

    def start_unless_running(self) -> subprocess.Popen[bytes] | None:
        """:meth:`start`, unless our process already runs (started, not answering yet): then ``None``, and
        :meth:`wait_answering` waits on that process instead. Starting it again would only fail on its port."""
        return None if self.running() else self.start()

    def start(self) -> subprocess.Popen[bytes]:
        """Start the broker's process (formatting its storage the first time), without waiting for it."""
        check_java()
        for port in (self.port, self.controller_port):
            if port_in_use(port):
                raise InfraError(
                    f"port {port} on 127.0.0.1 is taken by another process: stop it or choose --port/--controller-port"
                )
        self._write_config()
        self._format_storage_once()
        command = self._java_command("kafka.Kafka", str(self.home / "server.properties"))
        return self.process.start(command, output=self.home / "stdout.log")

    def wait_answering(self, process: subprocess.Popen[bytes] | None, deadline: float) -> None:
        """Wait until the started ``process`` answers clients: past ``deadline``, an :class:`InfraError`, and the
        process stopped. ``None``: our process, found running, is waited on and left running past the deadline."""
        while time.monotonic() < deadline:
            exited = not self.running() if process is None else process.poll() is not None
            if exited:
                said = log_tail(self.log_file, 20)
                if said.strip() in ("", "(no log)"):  # it ended before its logging started: the JVM's own words
                    said = log_tail(self.home / "stdout.log", 20)
                code = "" if process is None else f" with code {process.returncode}"
                raise KafkaExitedWhileStarting(f"Kafka exited{code} while starting; last lines:\n{said}")
            if port_in_use(self.port) and self._answers(timeout_s=2.0):
                return
            time.sleep(0.3)
        if process is None:  # not started by this call: left to the operator, who may know why it hangs
            raise InfraError(
                f"Kafka (pid {self.process.pid()}) runs but did not answer at {self.bootstrap_servers} in time: "
                f"`streamproof infra down` stops it; last lines of {self.log_file}:\n{log_tail(self.log_file, 20)}"
            )
        self.process.stop()
        raise InfraError(
            f"Kafka did not answer at {self.bootstrap_servers} in time; last lines of "
            f"{self.log_file}:\n{log_tail(self.log_file, 20)}"
        )

    def down(self, wipe: bool = False) -> str:
        """Stop the broker ``up`` started (by pid); ``wipe`` also deletes its data."""
        pid = self.process.stop()
        message = "Kafka was not running" if pid is None else f"stopped Kafka (pid {pid})"
        return wiped(self.home, message, wipe)

    def status(self) -> str:
        pid = self.process.pid()
        if pid is None:
            return f"Kafka: not running (state {self.home})"
        answers = "answering" if self._answers() else "NOT answering"
        return f"Kafka: running, pid {pid}, {self.bootstrap_servers}, {answers} (state {self.home})"


@dataclass
class KafkaCluster:
    """``infra up --kafka-brokers N``: ``N`` KRaft nodes, each a broker and a controller (a quorum of ``N`` voters),
    topics replicated on 3 of them (all when fewer), ``min.insync.replicas = 2``, no unclean leader election. Node
    ``k`` (from 0) listens on ``port + 2k`` and its controller on ``controller_port + 2k``; ``ports`` sets them
    instead (tests: free ports).

    >>> cluster = KafkaCluster(Path(".streamproof"), brokers=3)
    >>> cluster.bootstrap_servers
    '127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096'
    >>> cluster.members[2].home.name, cluster.members[2].voters
    ('kafka-3', '1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097')
    """

    state_dir: Path
    brokers: int = 3
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    ports: list[tuple[int, int]] | None = None  # each node's (client port, controller port)
    cluster_id: str = ""

    def __post_init__(self) -> None:
        if self.ports is None:
            self.ports = [(self.port + 2 * k, self.controller_port + 2 * k) for k in range(self.brokers)]
        self.brokers = len(self.ports)

    @property
    def shape_file(self) -> Path:
        return self.state_dir / KafkaBroker.folder / "cluster.json"

    @property
    def members(self) -> list[KafkaBroker]:
        assert self.ports is not None
        voters = ",".join(f"{k + 1}@127.0.0.1:{controller}" for k, (_, controller) in enumerate(self.ports))
        return [
            KafkaBroker(self.state_dir, port, controller, node_id=k + 1, voters=voters, cluster_id=self.cluster_id)
            for k, (port, controller) in enumerate(self.ports)
        ]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(member.bootstrap_servers for member in self.members)

    @classmethod
    def started_under(cls, state_dir: Path) -> KafkaCluster | None:
        """The cluster ``infra up --kafka-brokers`` formatted under ``state_dir``, if any."""
        shape = state_dir / KafkaBroker.folder / "cluster.json"
        if not shape.exists():
            return None
        saved = json.loads(shape.read_text())
        return cls(
            state_dir,
            ports=[(int(port), int(controller)) for port, controller in saved["ports"]],
            cluster_id=saved["cluster_id"],
        )

    def running(self) -> bool:
        return all(member.running() for member in self.members)

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the nodes that are not running, and wait until every one is a broker of the cluster."""
        self._check_shape()
        started = time.monotonic()
        deadline = started + timeout_s
        # a node left running by a start that failed elsewhere (another node exited) is waited on, not started again
        starting = [
            (member, member.start_unless_running())
            for member in self.members
            if not (member.running() and member._answers())
        ]
        for member, process in starting:  # a node answers once a majority of the controllers has elected a leader
            member.wait_answering(process, deadline)
        while len(self.broker_ids()) < self.brokers:
            if time.monotonic() > deadline:
                raise InfraError(
                    f"the Kafka cluster at {self.bootstrap_servers} has brokers {self.broker_ids()} "
                    f"after {timeout_s:.0f} s, not all {self.brokers}; see {self.state_dir}/kafka*/"
                    "server.log"
                )
            time.sleep(0.3)
        if not starting:
            return f"Kafka cluster already running at {self.bootstrap_servers} ({self.brokers} brokers)"
        took = f"in {time.monotonic() - started:.1f} s"
        if len(starting) < self.brokers:
            return f"started node(s) {[member.node_id for member, _ in starting]} of the Kafka cluster {took}"
        replication = min(self.brokers, 3)
        return (
            f"started a Kafka cluster (KRaft, {self.brokers} brokers, replication {replication}, min.insync.replicas "
            f"{min(replication, 2)}) at {self.bootstrap_servers} {took}"
        )

    def _check_shape(self) -> None:
        """Record the cluster's shape once; refuse a state folder formatted for another shape."""
        single = self.state_dir / KafkaBroker.folder / "broker.json"
        if self.shape_file.exists():
            saved = json.loads(self.shape_file.read_text())
            if [list(pair) for pair in self.ports or []] != saved["ports"]:
                raise InfraError(
                    f"{self.shape_file.parent} holds a Kafka cluster on ports {saved['ports']}: run "
                    "`streamproof infra down --wipe` first, or use --state-dir for another one"
                )
            self.cluster_id = saved["cluster_id"]
        elif single.exists():
            raise InfraError(
                f"{single.parent} holds a single Kafka broker: run `streamproof infra down --wipe` "
                "first, or use --state-dir for the cluster"
            )
        else:
            self.cluster_id = self.cluster_id or _cluster_id()
            self.shape_file.parent.mkdir(parents=True, exist_ok=True)
            self.shape_file.write_text(
                json.dumps({"ports": [list(pair) for pair in self.ports or []], "cluster_id": self.cluster_id})
            )

    def broker_ids(self) -> list[int]:
        """The ids of the brokers the cluster's metadata lists as alive (empty when no node answers)."""
        try:
            metadata = AdminClient(client_config(self.bootstrap_servers)).list_topics(timeout=5)
        except Exception:
            return []
        return sorted(metadata.brokers)

    def wait_in_sync(self, timeout_s: float = 60.0) -> None:
        """Wait until every partition of every topic has a leader and all its replicas in sync (a node back from a
        fault has caught up), or raise an :class:`InfraError` naming those that have not."""
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = AdminClient(client_config(self.bootstrap_servers)).list_topics(timeout=30)
            behind = [
                f"{topic}[{partition.id}]"
                for topic, described in metadata.topics.items()
                for partition in described.partitions.values()
                if partition.leader < 1 or sorted(partition.isrs) != sorted(partition.replicas)
            ]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise InfraError(f"Kafka partitions not back in sync after {timeout_s:.0f} s: {', '.join(behind[:10])}")
            time.sleep(0.5)

    def member(self, node_id: int) -> KafkaBroker:
        return self.members[node_id - 1]

    def leader_of(self, topic: str, partition: int = 0) -> KafkaBroker:
        """The node that leads ``topic``'s ``partition`` now."""
        metadata = AdminClient(client_config(self.bootstrap_servers)).list_topics(topic, timeout=30)
        leader = metadata.topics[topic].partitions[partition].leader
        if leader < 1:
            raise InfraError(f"{topic}[{partition}] has no leader now")
        return self.member(leader)

    def active_controller(self) -> KafkaBroker | None:
        """The node that leads the KRaft quorum now, None during an election: the newest epoch in the running nodes'
        ``quorum-state`` files (the quorum's own record; under KRaft, Kafka's DescribeCluster answers a random broker
        as 'controller')."""
        newest = (-1, -1)
        for member in self.members:
            state = member.home / "data" / "__cluster_metadata-0" / "quorum-state"
            try:
                saved = json.loads(state.read_text()) if member.running() else {}
            except (OSError, ValueError):
                continue
            newest = max(newest, (int(saved.get("leaderEpoch", -1)), int(saved.get("leaderId", -1))))
        leader = self.member(newest[1]) if newest[1] >= 1 else None
        return leader if leader is not None and leader.running() else None

    def down(self, wipe: bool = False) -> str:
        """Stop every node ``up`` started (by pid); ``wipe`` also deletes their data and the cluster's shape."""
        if wipe:  # their data goes: no shutdown to wait for (a node's waits for a quorum that is leaving too)
            for member in self.members:
                member.process.kill()
        # All at once: stopped one by one, the last node would wait out its shutdown with no quorum left to leave.
        with ThreadPoolExecutor(self.brokers) as pool:
            return "; ".join(pool.map(lambda member: member.down(wipe=wipe), self.members))

    def status(self) -> str:
        return "\n".join(f"node {member.node_id}: {member.status()}" for member in self.members)


def _cluster_id() -> str:
    # KRaft cluster ids are 16 random bytes, URL-safe base64 without padding (what StorageTool random-uuid prints).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
