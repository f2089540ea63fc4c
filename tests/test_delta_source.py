"""A Delta table as the source: bronze -> silver (change data feed -> MERGE into Delta), exactly-once through a crash.

Bronze is what a Kafka -> Delta pipeline writes (the valid records of generated orders with their Kafka
coordinates, 1% malformed left out), built in this process to keep the test short; it records its change
data feed. Its history: three appends of 2,000 generated events, an UPDATE of every delivered event (amount negated),
a DELETE of every cancelled order. Silver reads the feed and MERGEs the latest event of
each order (by event_time) into a Delta table; it is SIGKILLed after the sink commit of batch 1 and restarted
until drained. Expected: 0 lost, 0 duplicated, 0 unexpected over every change of the feed (inserts, update
post-images, deletes in quarantine as ``deleted_upstream``); counts taken from bronze's own UPDATE and DELETE.
A table without streamproof's coordinates is read with
``coordinates = ["event_id"]`` (no change feed) and reconciled too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import assert_every_sink_clean, run_cli
from streamproof import sources
from streamproof.config import load_pipeline, parse_pipeline
from streamproof.errors import ConfigError, PipelineError
from streamproof.faults.points import AFTER_SINK_COMMIT
from streamproof.generator import order_events
from streamproof.harness.crashes import run_with_crashes
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.transform.records import parse_records, valid_records

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
SILVER = """
name = "silver"
guarantee = "{guarantee}"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "delta"
path = "{workdir}/bronze"
read_change_feed = {feed}
{more}
[transform]
schema = "{schema}"
required = ["event_id", "order_id"]
quarantine = "{workdir}/quarantine"
[sink]
kind = "delta"
path = "{workdir}/silver"
{sink}
"""
MERGE = 'mode = "merge"\nkey = "order_id"\norder_by = "event_time"'
CDF_DEFAULT = "spark.databricks.delta.properties.defaults.enableChangeDataFeed"


def _silver(workdir: Path, *, guarantee: str = "exactly-once", feed: bool = True, more: str = "",
            sink: str = MERGE) -> str:  # fmt: skip
    text = SILVER.format(guarantee=guarantee, workdir=workdir, feed=str(feed).lower(), more=more, schema=SCHEMA,
                         sink=sink)  # fmt: skip
    return text


def _append_bronze(spark: Any, bronze: Path, index: int) -> int:
    """Append the valid records of 2,000 generated events, as a Kafka -> Delta pipeline writes them; their count."""
    events = order_events(2_000, seed=70 + index, malformed=0.01, start_index=index * 2_000)
    rows = [("orders", partition, index * 2_000 + n, value) for n, (partition, _, value, _) in enumerate(events)]
    kafka_rows = spark.createDataFrame(rows, "topic STRING, partition INT, offset LONG, value BINARY")
    kafka_rows = kafka_rows.selectExpr("*", "timestamp_millis(1795000000000 + offset) AS timestamp")
    spec = parse_pipeline(_silver(bronze.parent), source_name="bronze.toml")
    records = valid_records(parse_records(kafka_rows, spec.transform)).coalesce(1)
    spark.conf.set(CDF_DEFAULT, "true")
    try:
        records.write.format("delta").mode("append").save(str(bronze))
    finally:
        spark.conf.unset(CDF_DEFAULT)
    return spark.read.format("delta").load(str(bronze)).where(f"_src_offset >= {index * 2_000}").count()


def test_bronze_to_silver_through_the_change_feed_is_exactly_once_through_a_crash(spark: Any, tmp_path: Path) -> None:
    bronze = tmp_path / "bronze"
    inserted = sum(_append_bronze(spark, bronze, index) for index in range(3))
    updated = spark.sql(f"UPDATE delta.`{bronze}` SET amount = -amount WHERE status = 'delivered'").first()[0]
    deleted = spark.sql(f"DELETE FROM delta.`{bronze}` WHERE status = 'cancelled'").first()[0]
    assert updated > 0 and deleted > 0
    pipeline = tmp_path / "silver.toml"
    pipeline.write_text(_silver(tmp_path, more="max_files_per_trigger = 1"))

    harness = run_with_crashes(pipeline, [AFTER_SINK_COMMIT], log_dir=tmp_path / "logs", emit=lambda _: None)
    assert [crash.batch_id for crash in harness.crashes] == [1]
    assert harness.crashes[0].facts["sink_has_batch"] and not harness.crashes[0].facts["checkpoint_committed"]
    (report,) = assert_every_sink_clean(spark, pipeline, inserted + updated + deleted)
    assert report.quarantine_reasons == {"deleted_upstream": deleted}, report.to_json()
    # The independent checker reads the change feed with delta-rs and its own coordinate rules: the same figures.
    assert disagreements([report], verify_independently(load_pipeline(pipeline))) == []

    # Lineage: every silver row names its bronze row's Kafka coordinates; an update's post-image its bronze version.
    silver = spark.read.format("delta").load(str(tmp_path / "silver"))
    delivered = silver.where("status = 'delivered'").collect()
    assert delivered and all(row["amount"] < 0 and row["_src_topic"].endswith(":update_postimage") for row in delivered)
    # As of the version before the DELETE: silver keeps the rows deleted upstream (their deletes are in quarantine).
    before_delete = spark.read.format("delta").option("versionAsOf", 3).load(str(bronze))
    joined = silver.join(before_delete, ["_src_partition", "_src_offset", "event_id"])
    assert joined.count() == silver.count()


def test_a_table_streamproof_did_not_write_is_read_by_the_columns_that_identify_a_row(
    spark: Any, tmp_path: Path
) -> None:
    events = [value for _, _, value, _ in order_events(1_500, seed=77)]
    table = spark.read.json(spark.sparkContext.parallelize([v.decode() for v in events]), schema=SCHEMA)
    table.coalesce(1).write.format("delta").save(str(tmp_path / "bronze"))
    pipeline = tmp_path / "silver.toml"
    text = _silver(tmp_path, feed=False, sink='mode = "append"')
    pipeline.write_text(text)
    with pytest.raises(PipelineError, match="has no _src_topic, _src_partition, _src_offset"):
        sources.read_batch(spark, parse_pipeline(text, source_name="silver.toml"))

    text = text.replace("read_change_feed = false", 'read_change_feed = false\ncoordinates = ["event_id"]')
    pipeline.write_text(text)
    run = run_cli("run", str(pipeline), "--available-now")
    assert run.returncode == 0 and "committed: 1500 rows in" in run.stdout, run.stdout + run.stderr[-2000:]
    reports = assert_every_sink_clean(spark, pipeline, 1_500)
    assert disagreements(reports, verify_independently(load_pipeline(pipeline))) == []
    row = spark.read.format("delta").load(str(tmp_path / "silver")).select("event_id", "_src_topic").first()
    assert row["_src_topic"] == f'{{"event_id":"{row["event_id"]}"}}'

    with pytest.raises(PipelineError, match=r"does not record its changes \(delta.enableChangeDataFeed"):
        feed = text.replace("read_change_feed = false", "read_change_feed = true")
        sources.read_batch(spark, parse_pipeline(feed, source_name="silver.toml"))


def test_a_bronze_row_reaches_the_transform_with_every_value_as_it_was(spark: Any, tmp_path: Path) -> None:
    values = "'e1' AS event_id, 'o1' AS order_id, 'c1' AS customer_id, 1.0E-7D AS amount, 'paid' AS status"
    spark.sql(
        f"SELECT {values}, timestamp'2026-11-23 08:00:01.123456' AS event_time, 'orders' AS _src_topic, "
        "3 AS _src_partition, 41L AS _src_offset, timestamp'2026-11-23 08:00:02' AS _src_timestamp"
    ).write.format("delta").save(str(tmp_path / "bronze"))
    spec = parse_pipeline(_silver(tmp_path, feed=False, sink='mode = "append"'), source_name="silver.toml")
    (row,) = parse_records(sources.read_batch(spark, spec), spec.transform).collect()
    assert row["_reject_reason"] is None and row["amount"] == 1.0e-7, row
    assert (row["_src_topic"], row["_src_partition"], row["_src_offset"]) == ("orders", 3, 41)
    assert row["event_time"].microsecond == 123456 and row["_src_timestamp"].second == 2  # to_json keeps microseconds


def test_delta_source_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    def refused(text: str, match: str) -> None:
        with pytest.raises(ConfigError, match=match):
            parse_pipeline(text, source_name="silver.toml")

    refused(_silver(tmp_path, guarantee="at-most-once"), "a delta source supports exactly-once and at-least-once")
    refused(_silver(tmp_path, feed=False, more="starting_version = 3"), "starting_version: a table read without its")
    refused(
        _silver(tmp_path).split("[sink]")[0] + '[sink]\nkind = "postgres"\ntable = "silver"\nkey = "order_id"',
        "a delta source feeds delta and files sinks",
    )
    dedup = '[transform]\ndedup = {columns = ["event_id"], watermark = "event_time"}'
    refused(_silver(tmp_path).replace("[transform]", dedup), "dedup and windows need a kafka source")
    (tmp_path / "silver.toml").write_text(_silver(tmp_path))
    missing = run_cli("run", str(tmp_path / "silver.toml"), "--available-now")
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip() == (
        f"error: source.path: {tmp_path / 'bronze'} is not a Delta table (no _delta_log folder): point it at the table "
        "a pipeline writes (its [sink] path), or run that pipeline first"
    )
