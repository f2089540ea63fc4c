"""Restoring an older checkpoint backup, as an operator does it: the batches the sinks hold beyond it are taken
with the offsets they recorded, nothing is written twice, and every sink reconciles 0/0/0 by both checkers.

Operator actions (the replay issue's scenario, on four sinks): a fan-out pipeline with a Delta append (and its
quarantine table), a PostgreSQL running total per customer, a Kafka topic and a Parquet folder; 8,000 events in 4
partitions, batches of 2,000, 0.5 % malformed. `run --max-batches 2`; `checkpoint backup --to B`;
`run --available-now` (batches 2-3 and a short 4th; in the test's process, as the command calls it); 4,000 more
events arrive; `checkpoint restore --from B`;
`run --available-now`. Expected: the last run logs the batches the sinks hold from batch 2 on with the sinks'
offsets and, every sink holding each of them and the pipeline keeping no state, marks them done without running
them; the new events come after them, in batches of their own; it exits 0, and every sink holds each of the 12,000
events' valid records once: 0 lost / 0 duplicated / 0 unexpected by Spark's checker and by the independent one, the
quarantine table too. With the replay decided for the first batch of a run only, the Delta sink held the replayed
batches after the first twice; with Spark planning the replayed batches itself, their ranges took in the new events
and differed from the ones the sinks hold. A pipeline with state runs each held batch again, skipped by every sink
(tests/test_nemesis.py restores a deduplicating one); a checkpoint that is not the sinks' is refused by the same
rule (tests/test_sink_idempotency.py, every sink kind).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import assert_every_sink_clean, drain_in_process, run_cli
from streamproof.config import load_pipeline
from streamproof.generator import generate
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer
from streamproof.reconcile.independent import disagreements, verify_independently

pytestmark = [pytest.mark.integration]


def _pipeline(workdir: Path, broker: KafkaBroker, postgres: PostgresServer, batch: int = 2_000) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"pipeline-{batch}.toml"
    path.write_text(f"""
name = "restored"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "restored"
max_offsets_per_trigger = {batch}
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id", "customer_id"]
quarantine = "{workdir}/quarantine"
[[sinks]]
label = "delta"
kind = "delta"
path = "{workdir}/orders"
[[sinks]]
label = "totals"
kind = "postgres"
port = {postgres.port}
password = "${{{PG_PASSWORD_ENV}}}"
table = "restored_totals"
mode = "accumulate"
by = "customer_id"
sum = ["amount"]
[[sinks]]
label = "kafka"
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "restored-out"
[[sinks]]
label = "files"
kind = "files"
path = "{workdir}/files"
""")
    return path


def _run(*args: str) -> Any:
    done = run_cli(*args, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_restoring_an_older_backup_replays_the_batches_the_sinks_hold_and_writes_nothing_twice(
    kafka_broker: KafkaBroker,
    streamproof_postgres: PostgresServer,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generate(kafka_broker.bootstrap_servers, "restored", 8_000, partitions=4, malformed=0.005, seed=29)
    pipeline_file = _pipeline(tmp_path, kafka_broker, streamproof_postgres)
    backup = tmp_path / "backup-after-batch-1"

    _run("run", str(pipeline_file), "--max-batches", "2")
    _run("checkpoint", "backup", str(pipeline_file), "--to", str(backup))
    drained = drain_in_process(pipeline_file, monkeypatch)  # (the command's own process: the runs around it)
    generate(kafka_broker.bootstrap_servers, "restored", 4_000, partitions=4, malformed=0.005, seed=30)
    _run("checkpoint", "restore", str(pipeline_file), "--from", str(backup))

    replayed = _run("run", str(pipeline_file), "--available-now")
    print(replayed.stdout)
    held_through = max(int(line.split("batch ")[1].split(" ")[0]) for line in drained.splitlines()
                       if " committed:" in line)  # fmt: skip
    notice = (
        f"the sinks hold batches 2-{held_through} beyond the checkpoint's last committed batch 1 (an older checkpoint "
        "restored?): replaying them with the offsets the sinks recorded, each skipped where it is held"
    )
    assert notice in replayed.stdout, replayed.stdout
    # Every sink holds them with the offsets they recorded, and the pipeline keeps no state: nothing to run again.
    assert f"batches 2-{held_through}: held by every sink with those offsets" in replayed.stdout
    committed = [int(line.split("batch ")[1].split(" ")[0]) for line in replayed.stdout.splitlines()
                 if " committed:" in line]  # fmt: skip
    assert committed[0] == held_through + 1, replayed.stdout  # the new events, after the held batches

    spec = load_pipeline(pipeline_file)
    reports = assert_every_sink_clean(spark, pipeline_file, 12_000)
    assert [report.sink for report in reports] == ["delta", "totals", "kafka", "files"]
    assert all(report.quarantined > 0 for report in reports)  # the quarantine table is reconciled too
    assert disagreements(reports, verify_independently(spec)) == []
