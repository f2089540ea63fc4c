"""Shared fixtures. Integration tests start the real Kafka broker through the project's own infra code
(on free ports, under a temporary state folder) and a real local Spark session, and always stop them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamproof.infra import KafkaBroker

REPO = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 600

PIPELINE_TEMPLATE = """\
name = "{name}"
guarantee = "exactly-once"
checkpoint = "{workdir}/checkpoint"

[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
starting_offsets = "earliest"
max_offsets_per_trigger = {max_offsets}

[transform]
format = "json"
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
quarantine = "{workdir}/tables/quarantine"

[sink]
kind = "delta"
path = "{workdir}/tables/orders"
mode = "append"
"""


def write_pipeline(workdir: Path, *, name: str, topic: str, bootstrap: str, max_offsets: int) -> Path:
    """A pipeline file whose checkpoint and tables live under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.toml"
    path.write_text(
        PIPELINE_TEMPLATE.format(name=name, workdir=workdir, bootstrap=bootstrap, topic=topic, max_offsets=max_offsets)
    )
    return path


def run_cli(
    *args: str, timeout: float = CLI_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m streamproof ARGS`` as a separate process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "streamproof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


# The broker and Spark fixtures are the ones streamproof ships to its users (streamproof/testing.py),
# so the project's own tests exercise the plugin too.
@pytest.fixture(scope="session")
def kafka_broker(streamproof_kafka: KafkaBroker) -> KafkaBroker:
    """A real Apache Kafka (KRaft) broker on free ports, stopped and wiped at the end of the session."""
    return streamproof_kafka


@pytest.fixture(scope="session")
def spark(streamproof_spark: object) -> object:
    """The test process's SparkSession (streamproof defaults: cached jars, Delta, local[2])."""
    return streamproof_spark
