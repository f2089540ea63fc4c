"""The Prometheus endpoint and Spark's web UI of a running pipeline, read over HTTP while batches are being written,
and a real Prometheus server (Debian's) scraping it with streamproof's alerts.

24,000 events (0.5% malformed) in batches of 4,000, drained with available-now. Expected: a scrape
taken mid-run agrees exactly with the batch lines the run printed up to the batch the scrape reports as
last committed (rows in, rows out per sink, quarantined), lag is reported per Kafka partition, and the run
counter says 1; the start line names Spark's UI ([spark] ui_port), which answers with the run's streaming query.
Fault: after the second batch the pipeline's JVM is frozen (SIGSTOP), its Python side still answering scrapes.
Expected: Prometheus fires StreamproofBatchStalled for the pipeline (ops/prometheus/alerts.yml, its 5 minutes
shortened to 6 s, scraped every second), not before the freeze; thawed (SIGCONT), the run drains, every record
in its batches.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, write_pipeline
from streamproof.generator import generate
from streamproof.infra import KafkaBroker, free_port
from streamproof.infra.common import wait_until
from streamproof.infra.prometheus import ALERTS_FILE, PrometheusServer
from streamproof.metrics import partition_lag

pytestmark = pytest.mark.integration

_BATCH = re.compile(r"batch (\d+) committed: (\d+) rows in, (\d+) to sink, (\d+) quarantined")
_SAMPLE = re.compile(r"^(streamproof_\w+)\{([^}]*)\} (\S+)$")


def _scrape(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            samples[(match.group(1), match.group(2))] = float(match.group(3))
    return samples


def _jvm_under(pid: int) -> int:
    """The Spark JVM among ``pid``'s descendants (pyspark starts it through spark-submit)."""
    pending, seen = [pid], []
    while pending:
        parent = pending.pop()
        children = Path(f"/proc/{parent}/task/{parent}/children")
        pending += [int(child) for child in children.read_text().split()] if children.exists() else []
        seen.append(parent)
    for candidate in seen[1:]:
        command = Path(f"/proc/{candidate}/cmdline").read_bytes().split(b"\0")
        if command and command[0].endswith(b"java"):
            return candidate
    raise AssertionError(f"no JVM under pid {pid}")


def _stall_rules() -> str:
    """alerts.yml with the stall alert's 5 minutes (and its 1 minute `for`) made 6 s and 0 s, for a test."""
    rules = ALERTS_FILE.read_text()
    stall = rules.index("- alert: StreamproofBatchStalled")
    shortened = rules[stall:].replace(
        "streamproof_last_progress_timestamp_seconds > 300", "streamproof_last_progress_timestamp_seconds > 6", 1
    )
    shortened = shortened.replace("for: 1m", "for: 0s", 1)
    assert shortened != rules[stall:] and "> 6" in shortened.split("- alert:")[1]
    return rules[:stall] + shortened


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((REPO / "ops" / "grafana" / "streamproof.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    # Over the whole run (minutes, not Grafana's 5-minute windows) and every pipeline.
    return [expr.replace('"$pipeline"', '".*"').replace("[15m]", "[5m]") for expr in exprs]


def _firing(server: PrometheusServer, alert: str) -> list[dict[str, str]]:
    return [found["labels"] for found in server.alerts()
            if found["labels"]["alertname"] == alert and found["state"] == "firing"]  # fmt: skip


def test_metrics_scraped_during_a_run_agree_with_its_batches(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    generated = generate(kafka_broker.bootstrap_servers, "metrics", 24_000, partitions=4, malformed=0.005, seed=9)
    pipeline_file = write_pipeline(tmp_path, name="metered", topic="metrics", bootstrap=kafka_broker.bootstrap_servers,
                                   max_offsets=4_000)  # fmt: skip
    port, ui_port = free_port(), free_port()
    pipeline_file.write_text(pipeline_file.read_text() + f"\n[metrics]\nport = {port}\n[spark]\nui_port = {ui_port}\n")
    env = {name: value for name, value in os.environ.items() if name != "STREAMPROOF_SPARK_UI"}  # the UI on
    prometheus = PrometheusServer(tmp_path / "state", port=free_port(), targets=[f"127.0.0.1:{port}"], scrape_s=1,
                                  rules=_stall_rules())  # fmt: skip
    prometheus.up()

    child = subprocess.Popen(
        [sys.executable, "-m", "streamproof", "run", str(pipeline_file), "--available-now"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    batches: dict[int, tuple[int, int, int]] = {}
    scraped: dict[tuple[str, str], float] = {}
    ui_line, ui_page = "", ""
    before_freeze: list[dict[str, str]] = [{"not": "checked"}]
    fired: list[dict[str, str]] = []
    answered: dict[str, list[object]] = {}
    frozen = None
    deadline = time.monotonic() + 600
    try:
        assert child.stdout is not None
        for line in child.stdout:
            match = _BATCH.search(line)
            if match:
                batch, rows_in, rows_out, quarantined = (int(group) for group in match.groups())
                batches[batch] = (rows_in, rows_out, quarantined)
                if len(batches) == 2:
                    scraped = _scrape(port)  # mid-run: later batches are still to come
                    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/StreamingQuery/", timeout=10) as page:
                        ui_page = page.read().decode(errors="replace")
                    # Batches commit every few seconds now (the fresh JVM's first one may have been slower than 6 s).
                    wait_until(lambda: not _firing(prometheus, "StreamproofBatchStalled"), 15, interval_s=0.5)
                    before_freeze = _firing(prometheus, "StreamproofBatchStalled")
                    frozen = _jvm_under(child.pid)
                    os.kill(frozen, signal.SIGSTOP)
                    wait_until(lambda: bool(_firing(prometheus, "StreamproofBatchStalled")), 60, interval_s=1)
                    fired = _firing(prometheus, "StreamproofBatchStalled")
                    # Still frozen, still scraped: the dashboard's panels on what Prometheus holds of this run.
                    answered = {expr: prometheus.query(expr) for expr in _dashboard_queries()}
                    os.kill(frozen, signal.SIGCONT)
                    frozen = None
            if "Spark UI at " in line:
                ui_line = line
            assert time.monotonic() < deadline, "the run took more than 10 minutes"
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        child.wait(timeout=120)
        prometheus.down(wipe=True)
    # Every panel of the Grafana dashboard is a valid query with data from this run (the alert list has none).
    assert answered and all(answered.values()), [expr for expr, rows in answered.items() if not rows]
    assert child.returncode == 0
    assert before_freeze == [], before_freeze
    assert [(labels["pipeline"], labels["severity"]) for labels in fired] == [("metered", "page")], fired
    assert ui_line.rstrip().endswith(f":{ui_port}"), ui_line
    assert "Streaming Query" in ui_page and "metered" in ui_page, ui_page[:2000]
    assert len(batches) >= 5 and sum(rows for rows, _, _ in batches.values()) == 24_000

    pipeline = 'pipeline="metered"'
    last = int(scraped[("streamproof_last_committed_batch", pipeline)])
    upto = [counts for batch, counts in batches.items() if batch <= last]
    assert last >= 1 and last < max(batches)
    assert scraped[("streamproof_rows_in_total", pipeline)] == sum(rows for rows, _, _ in upto)
    assert scraped[("streamproof_rows_out_total", f'{pipeline},sink="delta"')] == sum(out for _, out, _ in upto)
    assert scraped[("streamproof_rows_quarantined_total", pipeline)] == sum(bad for _, _, bad in upto)
    assert scraped[("streamproof_runs_total", pipeline)] == 1
    assert scraped[("streamproof_batch_duration_seconds", pipeline)] > 0
    lags = {labels: value for (name, labels), value in scraped.items() if name == "streamproof_kafka_lag_records"}
    assert len(lags) == 4 and sum(lags.values()) > 0  # four partitions, and the run was not done yet
    assert generated.malformed > 0


def test_partition_lag_reads_both_forms_of_offsets() -> None:
    progress = {"sources": [{"endOffset": '{"t":{"0":5,"1":7}}', "latestOffset": {"t": {"0": 9, "1": 7}}}]}
    assert partition_lag(progress) == {"t": {"0": 4, "1": 0}}
    assert partition_lag({"sources": [{"endOffset": None, "latestOffset": None}]}) == {}
