"""A real Apache Kafka broker (KRaft, one node as broker and controller), started from the cached jars.

State lives under a state folder (default ``.streamproof/``): ``kafka/data`` (log dirs, formatted once),
``kafka/server.log``, ``kafka/broker.pid`` and ``kafka/broker.json`` (ports and cluster id). ``up`` is
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
from dataclasses import dataclass
from typing import ClassVar

from confluent_kafka.admin import AdminClient

from streamproof.errors import InfraError, log_tail
from streamproof.infra.common import START_TIMEOUT_S, DaemonProcess, LocalDaemon, port_in_use, wiped
from streamproof.jars import check_java, kafka_broker_classpath
from streamproof.kafka_client import client_config

DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093


SERVER_PROPERTIES = """\
# Written by streamproof infra up: one KRaft node acting as broker and controller.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
# A single node: every internal topic has one replica, so transactions and groups work.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
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
    """The local broker under ``state_dir/kafka``."""

    folder: ClassVar[str] = "kafka"
    log_name: ClassVar[str] = "server.log"
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT

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
            java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp", kafka_broker_classpath(), main_class, *args,
        ]  # fmt: skip

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
                json.dumps({"port": self.port, "controller_port": self.controller_port, "cluster_id": _cluster_id()})
            )
        (self.home / "server.properties").write_text(
            SERVER_PROPERTIES.format(port=self.port, controller_port=self.controller_port, data_dir=self.home / "data")
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
        check_java()
        for port in (self.port, self.controller_port):
            if port_in_use(port):
                raise InfraError(
                    f"port {port} on 127.0.0.1 is taken by another process: stop it or choose --port/--controller-port"
                )
        self._write_config()
        self._format_storage_once()
        started = time.monotonic()
        command = self._java_command("kafka.Kafka", str(self.home / "server.properties"))
        process = self.process.start(command, output=self.home / "stdout.log")
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise InfraError(
                    f"Kafka exited with code {process.returncode} while starting; last lines of "
                    f"{self.log_file}:\n{log_tail(self.log_file, 20)}"
                )
            if port_in_use(self.port) and self._answers(timeout_s=2.0):
                return f"started Kafka (KRaft) at {self.bootstrap_servers} in {time.monotonic() - started:.1f} s"
            time.sleep(0.3)
        self.process.stop()
        raise InfraError(
            f"Kafka did not answer at {self.bootstrap_servers} within {timeout_s:.0f} s; last lines of "
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


def _cluster_id() -> str:
    # KRaft cluster ids are 16 random bytes, URL-safe base64 without padding (what StorageTool random-uuid prints).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
