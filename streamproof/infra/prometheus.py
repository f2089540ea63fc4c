"""A local Prometheus server (Debian's ``prometheus``) scraping pipelines with streamproof's alerts loaded: the one
the tests fire an alert on. By hand, the shipped configuration does the same:
``prometheus --config.file=ops/prometheus/prometheus.yml`` (docs/operations.md).

Example::

    >>> server = PrometheusServer(Path(".streamproof"), port=9090, targets=["127.0.0.1:9108"])  # doctest: +SKIP
    >>> server.up()                                                                             # doctest: +SKIP
    'started Prometheus at http://127.0.0.1:9090 in 1.2 s (scraping 127.0.0.1:9108, alerts of ops/prometheus)'
    >>> server.alerts()                                                                         # doctest: +SKIP
    [{'labels': {'alertname': 'StreamproofBatchStalled', 'pipeline': 'orders', ...}, 'state': 'firing', ...}]
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from streamproof.errors import InfraError
from streamproof.infra.common import START_TIMEOUT_S, DaemonProcess, LocalDaemon, port_in_use, wait_until, wiped

OPS = Path(__file__).resolve().parents[2] / "ops" / "prometheus"
ALERTS_FILE = OPS / "alerts.yml"


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise InfraError("prometheus is not installed: run `make setup` (Debian package prometheus)")
    return found


@dataclass
class PrometheusServer(LocalDaemon):
    """Prometheus on 127.0.0.1:``port`` scraping ``targets`` (job ``streamproof``) every ``scrape_s`` seconds,
    with ``rules`` (default: ops/prometheus/alerts.yml) evaluated as often."""

    port: int = 9090
    targets: list[str] = field(default_factory=lambda: ["127.0.0.1:9108"])
    scrape_s: float = 15.0
    rules: str | None = None  # the text of a rules file; None: ops/prometheus/alerts.yml as shipped
    folder: ClassVar[str] = "prometheus"
    log_name: ClassVar[str] = "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def _process(self) -> DaemonProcess:
        return DaemonProcess(self.home / "prometheus.pid", str(self.home / "prometheus.yml"))

    def up(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the server (its configuration written fresh); returns a status line."""
        if self._process.pid() is not None:
            return f"Prometheus already running at {self.url}"
        if port_in_use(self.port):
            raise InfraError(f"port {self.port} on 127.0.0.1 is taken by another process: choose another port")
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "alerts.yml").write_text(self.rules if self.rules is not None else ALERTS_FILE.read_text())
        interval = f"{self.scrape_s:g}s"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": ["alerts.yml"],
            "scrape_configs": [{"job_name": "streamproof", "static_configs": [{"targets": self.targets}]}],
        }
        (self.home / "prometheus.yml").write_text(json.dumps(config, indent=2))  # YAML is a superset of JSON
        started = time.monotonic()
        process = self._process.start(
            [
                prometheus_binary(),
                f"--config.file={self.home / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            output=self.log_file,
        )
        if not wait_until(self._ready, timeout_s, exited=process):
            self.down()
            tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-15:])
            raise InfraError(f"Prometheus did not start at {self.url}; last lines of {self.log_file}:\n{tail}")
        return (
            f"started Prometheus at {self.url} in {time.monotonic() - started:.1f} s (scraping "
            f"{', '.join(self.targets)}, alerts of {ALERTS_FILE.parent})"
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (Prometheus's ``/api/v1/alerts``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=10) as response:
            return list(json.loads(response.read())["data"]["alerts"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of a PromQL query now (``/api/v1/query``); raises on a query Prometheus refuses."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return list(json.loads(response.read())["data"]["result"])
        except urllib.error.HTTPError as error:
            raise InfraError(f"Prometheus refused {expr!r}: {error.read().decode(errors='replace')[:300]}") from None

    def down(self, wipe: bool = False) -> str:
        """Stop the server ``up`` started (by its pid); ``wipe`` also deletes its data."""
        pid = self._process.stop()
        return wiped(
            self.home, "Prometheus was not running" if pid is None else f"stopped Prometheus ({self.url})", wipe
        )
