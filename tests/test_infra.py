"""The local broker: starts, answers, tolerates a second `up`, and `down` stops exactly what `up` started."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from conftest import run_cli
from streamproof.errors import InfraError
from streamproof.infra import HdfsCluster, KafkaBroker, SparkCluster, free_port, process_alive

pytestmark = pytest.mark.integration


def test_up_twice_is_harmless_and_down_stops_it(tmp_path: Path) -> None:
    port, controller = free_port(), free_port()
    state = tmp_path / "state"
    up = run_cli(
        "infra", "up", "--port", str(port), "--controller-port", str(controller), "--state-dir", str(state), timeout=180
    )
    try:
        assert up.returncode == 0, up.stderr
        assert f"started Kafka (KRaft) at 127.0.0.1:{port}" in up.stdout
        broker = KafkaBroker(state, port, controller)
        pid = int(broker.process.pid_file.read_text())
        again = run_cli(
            "infra",
            "up",
            "--port",
            str(port),
            "--controller-port",
            str(controller),
            "--state-dir",
            str(state),
            timeout=120,
        )
        assert again.returncode == 0
        assert f"already running at 127.0.0.1:{port} (pid {pid})" in again.stdout
        status = run_cli("infra", "status", "--state-dir", str(state), timeout=60)
        assert f"running, pid {pid}" in status.stdout and "answering" in status.stdout
    finally:
        down = run_cli("infra", "down", "--state-dir", str(state), timeout=120)
    assert down.returncode == 0 and f"stopped Kafka (pid {pid})" in down.stdout
    assert not process_alive(pid)
    assert "not running" in run_cli("infra", "status", "--state-dir", str(state), timeout=60).stdout


def test_down_never_kills_a_process_it_did_not_start(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path, free_port(), free_port())
    broker.home.mkdir(parents=True)
    broker.process.pid_file.write_text(str(os.getpid()))  # a recycled pid: this very test process
    assert broker.down() == "Kafka was not running"


def test_busy_port_is_a_clear_error(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    other = KafkaBroker(tmp_path, port=kafka_broker.port, controller_port=free_port())
    with pytest.raises(InfraError, match=rf"port {kafka_broker.port} on 127.0.0.1 is taken by another process"):
        other.up()


def test_storage_formats_with_a_cluster_id_that_starts_with_a_dash(tmp_path: Path) -> None:
    import base64
    import json

    cluster_id = base64.urlsafe_b64encode(b"\xf8" + bytes(range(15))).decode().rstrip("=")
    assert cluster_id.startswith("-")  # one random id in 64 does: CI once failed on one
    broker = KafkaBroker(tmp_path, free_port(), free_port())
    broker._write_config()
    settings = broker.home / "broker.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "cluster_id": cluster_id}))
    broker._format_storage_once()
    assert f"cluster.id={cluster_id}" in (broker.home / "data" / "meta.properties").read_text()


def test_a_taken_port_stops_the_cluster_daemons_before_they_start(tmp_path: Path) -> None:
    """The Spark Master's and HDFS's ports are checked before anything starts: one line, nothing left running."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spark = SparkCluster(tmp_path, workers=1, port=port, webui_port=free_port())
        with pytest.raises(InfraError, match=rf"port {port} on 127.0.0.1 is taken .*--spark-port"):
            spark.up()
        ports = {name: free_port() for name in HdfsCluster(tmp_path).ports} | {"namenode": port}
        with pytest.raises(InfraError, match=rf"port {port} on 127.0.0.1 \(HDFS namenode\) is taken"):
            HdfsCluster(tmp_path, ports=ports).up()
    assert not spark.running() and not HdfsCluster(tmp_path, ports=ports).running()
