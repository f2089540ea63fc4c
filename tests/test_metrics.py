"""The Prometheus endpoint and Spark's web UI of a running pipeline, read over HTTP while batches are being written.

No fault: 24,000 events (0.5% malformed) in batches of 4,000, drained with available-now. Expected: a scrape
taken mid-run agrees exactly with the batch lines the run printed up to the batch the scrape reports as
last committed (rows in, rows out per sink, quarantined), lag is reported per Kafka partition, and the run
counter says 1; the start line names Spark's UI ([spark] ui_port), which answers with the run's streaming query.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, write_pipeline
from streamproof.generator import generate
from streamproof.infra import KafkaBroker, free_port
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


def test_metrics_scraped_during_a_run_agree_with_its_batches(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    generated = generate(kafka_broker.bootstrap_servers, "metrics", 24_000, partitions=4, malformed=0.005, seed=9)
    pipeline_file = write_pipeline(tmp_path, name="metered", topic="metrics", bootstrap=kafka_broker.bootstrap_servers,
                                   max_offsets=4_000)  # fmt: skip
    port, ui_port = free_port(), free_port()
    pipeline_file.write_text(pipeline_file.read_text() + f"\n[metrics]\nport = {port}\n[spark]\nui_port = {ui_port}\n")
    env = {name: value for name, value in os.environ.items() if name != "STREAMPROOF_SPARK_UI"}  # the UI on

    child = subprocess.Popen(
        [sys.executable, "-m", "streamproof", "run", str(pipeline_file), "--available-now"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    batches: dict[int, tuple[int, int, int]] = {}
    scraped: dict[tuple[str, str], float] = {}
    ui_line, ui_page = "", ""
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
            if "Spark UI at " in line:
                ui_line = line
            assert time.monotonic() < deadline, "the run took more than 10 minutes"
    finally:
        child.wait(timeout=120)
    assert child.returncode == 0
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
