"""Real HDFS daemons on this machine: a NameNode and a DataNode, each its own JVM, from the Hadoop jars resolved
with Maven into the jar cache (the version pyspark bundles as its client).

State under ``state_dir/hdfs``: ``conf/`` (core-site, hdfs-site, log4j), ``name/`` (formatted once), ``data/``,
``hdfs.log``, the pid files. Every port binds 127.0.0.1; safe mode is left at once (one DataNode, replication 1).
The Hadoop jars carry no ``webapps/`` folders (the distribution tarball does): empty ones in ``conf/`` let the
daemons' HTTP servers start, which serve the JMX the readiness check reads.

Example::

    >>> from pathlib import Path
    >>> HdfsCluster(Path(".streamproof")).uri
    'hdfs://127.0.0.1:9000'
    >>> HdfsCluster(Path(".streamproof")).up()          # doctest: +SKIP
    'started HDFS at hdfs://127.0.0.1:9000 (a NameNode and a DataNode) in 14.2 s'
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, ClassVar

from streamproof.errors import InfraError, log_tail
from streamproof.infra.common import START_TIMEOUT_S, DaemonProcess, LocalDaemon, port_in_use, wait_until, wiped
from streamproof.jvm.jars import cached_jars, check_java

NAMENODE = "org.apache.hadoop.hdfs.server.namenode.NameNode"
DATANODE = "org.apache.hadoop.hdfs.server.datanode.DataNode"
DEFAULT_PORTS = {"namenode": 9000, "namenode_http": 9870, "datanode": 9866, "datanode_http": 9864, "datanode_ipc": 9867}

CORE_SITE = """<?xml version="1.0"?>
<!-- Written by streamproof infra up. -->
<configuration>
  <property><name>fs.defaultFS</name><value>hdfs://127.0.0.1:{namenode}</value></property>
</configuration>
"""
HDFS_SITE = """<?xml version="1.0"?>
<!-- Written by streamproof infra up: one NameNode and one DataNode on 127.0.0.1, replication 1. -->
<configuration>
  <property><name>dfs.replication</name><value>1</value></property>
  <property><name>dfs.namenode.name.dir</name><value>file://{home}/name</value></property>
  <property><name>dfs.datanode.data.dir</name><value>file://{home}/data</value></property>
  <property><name>dfs.namenode.rpc-bind-host</name><value>127.0.0.1</value></property>
  <property><name>dfs.namenode.http-address</name><value>127.0.0.1:{namenode_http}</value></property>
  <property><name>dfs.datanode.address</name><value>127.0.0.1:{datanode}</value></property>
  <property><name>dfs.datanode.http.address</name><value>127.0.0.1:{datanode_http}</value></property>
  <property><name>dfs.datanode.ipc.address</name><value>127.0.0.1:{datanode_ipc}</value></property>
  <property><name>dfs.permissions.enabled</name><value>false</value></property>
  <property><name>dfs.namenode.safemode.extension</name><value>0</value></property>
  <property><name>dfs.namenode.safemode.min.datanodes</name><value>0</value></property>
  <!-- A DataNode restarted by the crash harness is back at once; declare a dead one dead within 30 s. -->
  <property><name>dfs.heartbeat.interval</name><value>1</value></property>
  <property><name>dfs.namenode.heartbeat.recheck-interval</name><value>15000</value></property>
</configuration>
"""
LOG4J_PROPERTIES = """log4j.rootLogger=INFO,FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log_file}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d %p %c{{1}}: %m%n
log4j.logger.org.apache.hadoop.hdfs.StateChange=WARN
log4j.logger.BlockStateChange=WARN
"""


@dataclass
class HdfsCluster(LocalDaemon):
    """A NameNode and a DataNode under ``state_dir/hdfs`` (see the module)."""

    folder: ClassVar[str] = "hdfs"
    log_name: ClassVar[str] = "hdfs.log"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))

    @property
    def uri(self) -> str:
        return f"hdfs://127.0.0.1:{self.ports['namenode']}"

    @property
    def namenode(self) -> DaemonProcess:
        return DaemonProcess(self.home / "namenode.pid", NAMENODE)

    @property
    def datanode(self) -> DaemonProcess:
        return DaemonProcess(self.home / "datanode.pid", DATANODE)

    def _classpath(self) -> str:
        return os.pathsep.join([str(self.home / "conf"), *(str(jar) for jar in cached_jars("hdfs"))])

    def _java(self, main_class: str, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            java,
            "-Xmx384m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={self.home}",  # Jetty's folders of its web servers, left behind by a killed daemon
            "-cp",
            self._classpath(),
            main_class,
            *args,
        ]

    def _write_config(self) -> None:
        conf = self.home / "conf"
        for webapp in ("hdfs", "datanode", "secondary"):
            (conf / "webapps" / webapp / "WEB-INF").mkdir(parents=True, exist_ok=True)
            (conf / "webapps" / webapp / "WEB-INF" / "web.xml").write_text("<web-app/>\n")
        (conf / "webapps" / "static").mkdir(exist_ok=True)
        (conf / "core-site.xml").write_text(CORE_SITE.format(**self.ports))
        (conf / "hdfs-site.xml").write_text(HDFS_SITE.format(home=self.home, **self.ports))
        (conf / "log4j.properties").write_text(LOG4J_PROPERTIES.format(log_file=self.log_file))

    def _format_once(self) -> None:
        if (self.home / "name" / "current" / "VERSION").exists():
            return
        done = subprocess.run(
            self._java(NAMENODE, "-format", "-force", "-nonInteractive"), capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise InfraError(
                f"formatting HDFS in {self.home / 'name'} failed; last lines of {self.log_file}:\n"
                f"{log_tail(self.log_file, 20)}"
            )

    def _namenode_state(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ports['namenode_http']}/jmx?qry=Hadoop:service=NameNode,name=FSNamesystemState"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                beans = json.load(answer).get("beans") or [{}]
        except (OSError, ValueError):
            return {}
        return dict(beans[0])

    def live_datanodes(self) -> int:
        state = self._namenode_state()
        return int(state.get("NumLiveDataNodes", 0)) if state.get("FSState") == "Operational" else 0

    def running(self) -> bool:
        return self.namenode.pid() is not None

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the NameNode and the DataNode if they are not running; wait until the DataNode is live."""
        if self.running() and self.live_datanodes() >= 1:
            return f"HDFS already running at {self.uri} ({self.live_datanodes()} live DataNode)"
        check_java()
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config()
        if not self.running():
            for name, port in self.ports.items():
                if port_in_use(port):
                    ports = ", ".join(map(str, self.ports.values()))
                    raise InfraError(
                        f"port {port} on 127.0.0.1 (HDFS {name.replace('_', ' ')}) is taken by another "
                        f"process: stop it (HDFS uses {ports})"
                    )
            self._format_once()
            self.namenode.start(self._java(NAMENODE), output=self.home / "namenode.out")
        if self.datanode.pid() is None:
            self.start_datanode()
        if not wait_until(lambda: self.live_datanodes() >= 1, timeout_s):
            raise InfraError(
                f"HDFS did not report a live DataNode within {timeout_s:.0f} s; last lines of "
                f"{self.log_file}:\n{log_tail(self.log_file, 20)}"
            )
        return f"started HDFS at {self.uri} (a NameNode and a DataNode) in {time.monotonic() - started:.1f} s"

    def start_datanode(self) -> int:
        """Start the DataNode (after a fault killed it, too); returns its pid."""
        return self.datanode.start(self._java(DATANODE), output=self.home / "datanode.out").pid

    def down(self, wipe: bool = False) -> str:
        """Stop the DataNode and the NameNode ``up`` started (by pid); ``wipe`` also deletes the file system."""
        datanode, namenode = self.datanode.stop(), self.namenode.stop()
        message = (
            "HDFS was not running"
            if namenode is None and datanode is None
            else (f"stopped HDFS (NameNode {namenode}, DataNode {datanode})")
        )
        return wiped(self.home, message, wipe)

    def status(self) -> str:
        if not self.running():
            return f"HDFS: not running (state {self.home})"
        return f"HDFS: running at {self.uri}, {self.live_datanodes()} live DataNode (state {self.home})"
