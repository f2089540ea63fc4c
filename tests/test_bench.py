"""`streamproof bench`: the pure parts in isolation, and one real throughput benchmark on a small topic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from streamproof.bench.common import ratio
from streamproof.bench.kafka_delta_ingest import BINARY_ENV, commits, create_empty_table
from streamproof.bench.latency import commit_timestamps
from streamproof.bench.runner import check_request
from streamproof.errors import ConfigError
from streamproof.infra import KafkaBroker


def test_ratio_rounds_and_refuses_a_zero_baseline() -> None:
    assert ratio(61_240, 67_310) == 0.91
    assert ratio(5, 0) is None


def test_unknown_benchmark_and_tiny_data_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="unknown benchmark 'speed'"):
        check_request(["throughput", "speed"], 100_000)
    with pytest.raises(ConfigError, match="at least 10,000"):
        check_request(["throughput"], 500)
    result = run_cli("bench", "speed", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown benchmark 'speed': expected one of throughput, latency, recovery, sinks, scaling, tuning, "
        "partitioned, cluster, age"
    ]


def test_commit_timestamps_map_each_data_file_to_its_commit(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    (log / "00000000000000000000.json").write_text(
        '{"commitInfo":{"timestamp":1000,"operation":"WRITE"}}\n{"add":{"path":"part-a.parquet","size":1}}\n'
        '{"add":{"path":"part-b.parquet","size":1}}\n'
    )
    (log / "00000000000000000001.json").write_text(
        '{"add":{"path":"part-c.parquet","size":1}}\n{"commitInfo":{"timestamp":2500,"inCommitTimestamp":2400}}\n'
    )
    (log / "00000000000000000001.crc").write_text("{}")
    assert commit_timestamps(tmp_path) == {"part-a.parquet": 1000, "part-b.parquet": 1000, "part-c.parquet": 2400}


@pytest.mark.integration
def test_throughput_benchmark_writes_its_results_with_same_run_ratios(
    kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BINARY_ENV, "off")  # kafka-delta-ingest left out: the same test on every machine
    events = 20_000
    results = tmp_path / "results"
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench", "throughput", "--events", str(events), "--rounds", "1", "--json", str(out),
        "--results-dir", str(results),
        "--bootstrap-servers", kafka_broker.bootstrap_servers, "--state-dir", str(tmp_path / "state"),
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    document = json.loads(out.read_text())
    (written,) = results.glob("*-throughput.json")
    assert json.loads(written.read_text()) == document
    machine = document["machine"]
    assert machine["cores"] >= 1 and machine["memory_gib"] > 0 and machine["pyspark"].startswith("4.")
    throughput = document["results"]["throughput"]
    for run in ("delta_exactly_once", "parquet_at_least_once", "delta_at_least_once"):
        assert throughput[run]["rows_in"] == events, run
        assert throughput[run]["rows_per_second"] > 0
    assert throughput["consumer_read"]["records"] == events
    assert throughput["spark_count"]["records"] == events
    assert throughput["ceiling"]["records"] == events
    assert throughput["native_delta_sink"]["rows_in"] == events  # Spark's own Delta sink read every record
    assert len(throughput["native_delta_sink"]["batch_duration_ms"]) == throughput["native_delta_sink"]["batches"]
    # Where each batch's time went: the phases add up to the batch's duration, in the order they ran.
    for batch in throughput["delta_exactly_once"]["batch_phases_s"]:
        duration, queued = batch.pop("duration_s"), batch.pop("queued_s")
        batch.pop("batch")
        assert list(batch)[:3] == ["plan", "offset_log", "read_parse"] and list(batch)[-2:] == ["commit_log", "other"]
        assert any(name.startswith("sink:") for name in batch) and batch["read_parse"] > 0
        assert abs(sum(batch.values()) - duration) <= 0.1 + 0.05 * duration, (batch, duration)
        assert queued is not None and queued > 0  # generated before the run: its records waited in Kafka
    assert "where the time went" in result.stdout
    ratios = throughput["ratios"]
    # 20,000 events make one batch: there is no batch after the first to give a steady rate.
    assert ratios.pop("steady_delta_exactly_once_vs_parquet_at_least_once") is None
    assert ratios.pop("steady_exactly_once_over_native_delta_sink") is None
    assert ratios.pop("clean_exactly_once_over_kafka_delta_ingest_from_launch") is None
    assert throughput["delta_exactly_once_clean_topic"]["rows_in"] == events  # the topic of valid records only
    assert all(value is not None and value > 0 for value in ratios.values()), ratios
    # Each side's medians (one round here), the first batch apart; the lease's cost against a run never renewing.
    for side in ("delta_exactly_once", "native_delta_sink", "delta_exactly_once_no_renewal"):
        medians = throughput["medians"][side]
        assert medians["rows_per_second"] > 0 and medians["first_batch_s"] > 0, (side, medians)
        assert throughput["sides"][side]["rounds"][0]["batch_seconds"][0] == medians["first_batch_s"]
    assert "exactly_once_vs_no_lease_renewal" in ratios
    assert "throughput:" in result.stdout and "results written to" in result.stdout
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")  # each round's batches, drawn beside it
    assert not (tmp_path / "state" / "bench").exists() or not any((tmp_path / "state" / "bench").iterdir())


def test_steady_rate_leaves_out_the_first_batch() -> None:
    from streamproof.bench.common import PipelineRun

    run = PipelineRun("p", rows_in=300, query_started_at=1.0)
    run.batches = [{"t": 11.0, "batch": 0, "rows": 100, "duration_s": 10.0},
                   {"t": 13.0, "batch": 1, "rows": 100, "duration_s": 1.0},
                   {"t": 15.0, "batch": 2, "rows": 100, "duration_s": 1.0}]  # fmt: skip
    assert run.seconds == 14.0
    assert round(run.rows_per_second, 2) == 21.43
    assert run.steady_rows_per_second == 100.0
    assert PipelineRun("p").steady_rows_per_second == 0.0


def test_a_kafka_delta_ingest_table_is_made_empty_and_its_commits_read_with_their_rows(tmp_path: Path) -> None:
    """The kafka-delta-ingest side writes into a table that exists (version 0, made without a JVM) and is timed by
    its commits' files: each commit's rows from its files' statistics, version 0 left out."""
    from streamproof.bench.throughput import figures_of_ingester

    table = tmp_path / "orders"
    create_empty_table(table, "event_id STRING, amount DOUBLE, event_time TIMESTAMP")
    zero = [json.loads(line) for line in (table / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    assert zero[0] == {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    schema = json.loads(zero[1]["metaData"]["schemaString"])
    assert [(f["name"], f["type"]) for f in schema["fields"]] == [
        ("event_id", "string"), ("amount", "double"), ("event_time", "timestamp")
    ]
    assert commits(table) == []
    for version, rows in ((1, 500), (2, 300)):
        add = {"add": {"path": f"part-{version}.parquet", "stats": json.dumps({"numRecords": rows})}}
        txn = {"txn": {"appId": "kdi", "version": version}}
        (table / "_delta_log" / f"{version:020d}.json").write_text(json.dumps(txn) + "\n" + json.dumps(add) + "\n")
    assert [rows for _, rows in commits(table)] == [500, 300]
    run = {"rows_in": 800, "rows_per_second_from_launch": 80, "first_commit_from_launch_s": 6.0, "batches": 2,
           "batch_seconds": [6.0, 4.0], "batch_rows": [400, 400]}  # fmt: skip
    figures = figures_of_ingester(run)
    assert figures["first_batch_s"] == 6.0 and figures["steady_rows_per_second"] == 100
