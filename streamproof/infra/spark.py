"""A real Spark standalone cluster on this machine: a Master and N Workers, each its own JVM, started with the
``bin/spark-class`` pyspark ships; executors run in JVMs of their own that the Workers start.

Each Worker binds a loopback address of its own (``127.0.0.2``, ``127.0.0.3``, ...): Spark treats them as
different hosts, so a retried or speculative task attempt can run on the other worker, as on a real cluster.
State under ``state_dir/spark``: ``master.log``, ``worker-<n>.log``, the pid files, and each worker's work and
scratch folders. ``up`` is idempotent; ``down`` stops only the processes ``up`` started.

Example::

    >>> from pathlib import Path
    >>> cluster = SparkCluster(Path(".streamproof"), workers=2)
    >>> cluster.master_url
    'spark://127.0.0.1:7077'
    >>> cluster.up()            # doctest: +SKIP
    'started a Spark standalone cluster at spark://127.0.0.1:7077 (2 workers of 1 core, 1g) in 21.4 s'
"""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from streamproof.errors import InfraError, log_tail
from streamproof.infra.common import START_TIMEOUT_S, DaemonProcess, LocalDaemon, port_in_use, wait_until, wiped
from streamproof.jvm.jars import check_java

DEFAULT_MASTER_PORT = 7077
DEFAULT_WEBUI_PORT = 8080


def spark_home() -> Path:
    """The installed pyspark's folder: Spark's ``bin/`` and ``jars/`` (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise InfraError("pyspark is not installed: run `make setup`")
    return Path(spec.origin).resolve().parent


@dataclass
class SparkCluster(LocalDaemon):
    """A Master and ``workers`` Workers under ``state_dir/spark`` (see the module)."""

    folder: ClassVar[str] = "spark"
    log_name: ClassVar[str] = "master.log"
    workers: int = 2
    port: int = DEFAULT_MASTER_PORT
    webui_port: int = DEFAULT_WEBUI_PORT
    worker_cores: int = 1
    worker_memory: str = "1g"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def master(self) -> DaemonProcess:
        return DaemonProcess(self.home / "master.pid", f"--port {self.port} --webui-port {self.webui_port}")

    def worker(self, number: int) -> DaemonProcess:
        """Worker ``number`` (from 1): its process, recognised by its own loopback host and the master's URL."""
        return DaemonProcess(self.home / f"worker-{number}.pid", f"--host {self.worker_host(number)} ")

    def worker_host(self, number: int) -> str:
        return f"127.0.0.{1 + number}"

    @classmethod
    def started_under(cls, state_dir: Path) -> SparkCluster:
        """The cluster ``up`` started under ``state_dir``, with the workers and ports it was started with."""
        try:
            saved = json.loads((state_dir / cls.folder / "cluster.json").read_text())
        except (OSError, ValueError):
            return cls(state_dir)
        return cls(
            state_dir, workers=int(saved["workers"]), port=int(saved["port"]), webui_port=int(saved["webui_port"])
        )

    def _saved_workers(self) -> int:
        return SparkCluster.started_under(self.state_dir).workers

    def _state(self) -> dict[str, Any] | None:
        """The master's view (``/json``), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as answer:
                return dict(json.load(answer))
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self._state()
        return int(state.get("aliveworkers", 0)) if state and state.get("status") == "ALIVE" else 0

    def _spark_class(self, main_class: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main_class, *args]

    def _environment(self, number: int | None = None) -> dict[str, str]:
        env = {"SPARK_HOME": str(spark_home()), "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(self.home)}
        if number is not None:
            folder = self.home / f"worker-{number}"
            env.update(SPARK_WORKER_DIR=str(folder / "work"), SPARK_LOCAL_DIRS=str(folder / "scratch"))
        return env

    def running(self) -> bool:
        return self.master.pid() is not None

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the master and the workers not running yet; wait until the master sees them all alive."""
        if self.running() and self.alive_workers() >= self.workers:
            return f"Spark cluster already running at {self.master_url} ({self.alive_workers()} workers alive)"
        check_java()
        started = time.monotonic()
        if not self.running():
            for port in (self.port, self.webui_port):
                if port_in_use(port):
                    raise InfraError(
                        f"port {port} on 127.0.0.1 is taken by another process: stop it or choose "
                        "--spark-port/--spark-webui-port"
                    )
            self.home.mkdir(parents=True, exist_ok=True)
            master = self.master.start(
                self._spark_class(
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ),
                output=self.log_file,
                env=self._environment(),
            )
            if not wait_until(lambda: self._state() is not None, timeout_s, exited=master):
                self.master.stop()
                raise InfraError(
                    f"the Spark master did not answer on port {self.webui_port} within {timeout_s:.0f} s; "
                    f"last lines of {self.log_file}:\n{log_tail(self.log_file, 20)}"
                )
        saved = {"workers": self.workers, "port": self.port, "webui_port": self.webui_port}
        (self.home / "cluster.json").write_text(json.dumps(saved))
        for number in range(1, self.workers + 1):
            if self.worker(number).pid() is None:
                self.start_worker(number)
        if not wait_until(lambda: self.alive_workers() >= self.workers, timeout_s):
            raise InfraError(
                f"{self.alive_workers()} of {self.workers} Spark workers registered within "
                f"{timeout_s:.0f} s; see {self.home}/worker-*.log"
            )
        return (
            f"started a Spark standalone cluster at {self.master_url} ({self.workers} workers of "
            f"{self.worker_cores} core, {self.worker_memory}) in {time.monotonic() - started:.1f} s"
        )

    def start_worker(self, number: int) -> int:
        """Start worker ``number`` (after a fault killed it, too); returns its pid."""
        port = self.webui_port + number
        if port_in_use(port):
            # The Worker's web UI is only for people: if its port was taken (a restarted Worker races every process
            # that binds a free port for the one its predecessor left), Spark picks a free one (port 0).
            port = 0
        process = self.worker(number).start(
            self._spark_class(
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                self.worker_host(number),
                "--webui-port",
                str(port),
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                self.master_url,
            ),
            output=self.home / f"worker-{number}.log",
            env=self._environment(number),
        )
        return process.pid

    def down(self, wipe: bool = False) -> str:
        """Stop the workers and the master ``up`` started (each by its pid); ``wipe`` deletes their folders."""
        stopped = [pid for number in range(1, self._saved_workers() + 1) if (pid := self.worker(number).stop())]
        master = self.master.stop()
        message = (
            "Spark cluster was not running"
            if master is None and not stopped
            else (f"stopped the Spark cluster (master {master}, {len(stopped)} workers)")
        )
        return wiped(self.home, message, wipe)

    def status(self) -> str:
        if not self.running():
            return f"Spark cluster: not running (state {self.home})"
        return (
            f"Spark cluster: running at {self.master_url}, {self.alive_workers()} of {self._saved_workers()} "
            f"workers alive, web UI http://127.0.0.1:{self.webui_port} (state {self.home})"
        )
