"""Faults outside Spark: the Kafka broker and the PostgreSQL server go away in the middle of a run.

Fault 1: the broker is stopped after the second committed batch and started again 5 s later.
Fault 2: PostgreSQL is stopped (fast shutdown: connections terminated) after the second committed batch and
started again 5 s later. Expected for both: the run ends by itself with exit 0, and reconciles 0 lost /
0 duplicated. Faults 1 and 2 are in the slow tier (`make test-all`; tests/conftest.py names their twins in CI).
Fault 3: PostgreSQL is down for longer than ``[retry] max_outage`` (8 s). Expected: the run stops with one
line naming the unreachable sink (exit 2, no stack trace); once the server is back, the next run drains and
reconciles 0/0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, assert_every_sink_clean, run_cli, write_pipeline
from streamproof.generator import generate
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def _run_with_fault_after_two_batches(pipeline_file: Path, fault: Any) -> tuple[int, str]:
    """Run the pipeline as a user would; after its second batch line, call ``fault`` (it may block)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "streamproof", "run", str(pipeline_file), "--available-now"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ},
    )  # fmt: skip
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(child.stderr or []), daemon=True).start()
    lines, injected, back_at = [], False, 0.0
    assert child.stdout is not None
    for line in child.stdout:
        lines.append(line)
        if not injected and sum(" committed: " in seen for seen in lines) == 2:
            fault()
            injected, back_at = True, time.monotonic()
        elif injected and back_at and " committed: " in line:
            print(f"server back -> next batch committed in {time.monotonic() - back_at:.1f} s")
            back_at = 0.0
    child.wait(timeout=600)
    assert injected, "the run ended before its second batch: too little data for the fault"
    return child.returncode, "".join(lines) + "".join(stderr)


def _restart(stop: Any, start: Any) -> Any:
    def fault() -> None:
        stop()
        time.sleep(5)
        start()

    return fault


def test_kafka_broker_restart_mid_run_is_survived(kafka_broker: KafkaBroker, spark: Any, tmp_path: Path) -> None:
    generate(kafka_broker.bootstrap_servers, "outage-kafka", 10_000, partitions=4, malformed=0.005, seed=12)
    pipeline_file = write_pipeline(tmp_path, name="outage-kafka", topic="outage-kafka",
                                   bootstrap=kafka_broker.bootstrap_servers, max_offsets=2_500)  # fmt: skip
    code, output = _run_with_fault_after_two_batches(pipeline_file, _restart(kafka_broker.down, kafka_broker.up))
    assert code == 0, output[-3000:]
    assert_every_sink_clean(spark, pipeline_file, 10_000)


def _postgres_pipeline(workdir: Path, broker: KafkaBroker, postgres: PostgresServer, name: str, outage: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    pipeline_file = workdir / "pipeline.toml"
    pipeline_file.write_text(f"""
name = "{name}"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "{name}"
max_offsets_per_trigger = 2500
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id", "customer_id"]
quarantine = "{workdir}/quarantine"
[sink]
kind = "postgres"
port = {postgres.port}
password = "${{{PG_PASSWORD_ENV}}}"
table = "{name.replace("-", "_")}"
mode = "accumulate"
by = "customer_id"
sum = ["amount"]
[retry]
max_outage = "{outage}"
backoff = "1 second"
""")
    return pipeline_file


def test_postgres_restart_mid_run_is_survived(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path
) -> None:
    generate(kafka_broker.bootstrap_servers, "outage-pg", 15_000, partitions=4, malformed=0.005, seed=13)
    pipeline_file = _postgres_pipeline(tmp_path, kafka_broker, streamproof_postgres, "outage-pg", "2 minutes")
    code, output = _run_with_fault_after_two_batches(
        pipeline_file, _restart(streamproof_postgres.down, streamproof_postgres.up)
    )
    assert code == 0, output[-3000:]
    assert "unreachable" in output  # the outage was seen, and ridden out
    assert_every_sink_clean(spark, pipeline_file, 15_000)


def test_an_outage_longer_than_the_bound_stops_cleanly_and_the_next_run_resumes(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path
) -> None:
    generate(kafka_broker.bootstrap_servers, "outage-long", 10_000, partitions=4, malformed=0.0, seed=14)
    pipeline_file = _postgres_pipeline(tmp_path, kafka_broker, streamproof_postgres, "outage-long", "8 seconds")
    try:
        code, output = _run_with_fault_after_two_batches(pipeline_file, streamproof_postgres.down)
    finally:
        streamproof_postgres.up()
    assert code == 2, output[-3000:]
    # The CLI's own line; Spark's logger may print its ERROR lines about the stopped query before or after it.
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-3000:]
    message = errors[0]
    assert message.startswith("error: pipeline 'outage-long' failed: postgresql://streamproof@127.0.0.1:"), message
    assert "unreachable for more than 8 seconds" in message and "start the pipeline again once it is back" in message
    resumed = run_cli("run", str(pipeline_file), "--available-now", timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_every_sink_clean(spark, pipeline_file, 10_000)
