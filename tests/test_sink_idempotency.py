"""Each sink's idempotency rule, three cases each: the first write lands, a replay of the batch writes
nothing (every replayed batch, however many: a restored older checkpoint replays several), and a replay that does
not match what the sink recorded for that batch is a precise error.

Real Delta, PostgreSQL, Kafka and Parquet; the batches are written directly with the sinks' own code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamproof.config import PostgresSinkSpec, parse_pipeline
from streamproof.errors import PipelineError
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer
from streamproof.sinks import open_sink
from streamproof.sinks.base import Batch

pytestmark = pytest.mark.integration

SCHEMA = "event_id STRING, order_id STRING, amount DOUBLE, event_time TIMESTAMP"
ROW_SCHEMA = f"{SCHEMA}, _src_topic STRING, _src_partition INT, _src_offset BIGINT, _src_timestamp TIMESTAMP"


def _spec(sink: str, workdir: Path, bootstrap: str, transform: str = "") -> Any:
    return parse_pipeline(f"""
name = "idem"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "idem-in"
[transform]
schema = "{SCHEMA}"
required = ["event_id", "order_id"]
{transform}
[sink]
{sink}
""")


def _rows(spark: Any, offsets: range, order: str = "o") -> Any:
    from datetime import datetime

    rows = [(f"e{i}", f"{order}{i % 5}", float(i), datetime(2026, 1, 1, 0, 0, i % 60), "idem-in", i % 2, i,
             datetime(2026, 1, 1)) for i in offsets]  # fmt: skip
    # Like a Kafka micro-batch: one Spark partition per source partition, in offset order.
    frame = spark.createDataFrame(rows, ROW_SCHEMA)
    return frame.repartitionByRange(2, "_src_partition").sortWithinPartitions("_src_offset")


def _log_of(table: Path) -> list[dict[str, Any]]:
    """Every action of the Delta table's commit files, in order."""
    return [json.loads(line) for commit in sorted((table / "_delta_log").glob("*.json"))
            for line in commit.read_text().splitlines()]  # fmt: skip


def _batch(batch_id: int, rows: int, end: int) -> Batch:
    return Batch("idem", batch_id, {"idem-in": {"0": end, "1": end}}, keyed=True, rows=rows)


SINKS = {
    "delta-append": 'kind = "delta"\npath = "{workdir}/append"',
    "delta-merge": 'kind = "delta"\npath = "{workdir}/merge"\nmode = "merge"\nkey = "order_id"',
    "postgres-upsert": 'kind = "postgres"\nport = {pg_port}\ntable = "idem_upsert"\nmode = "upsert"\nkey = "order_id"\n'
    'password = "${{STREAMPROOF_PG_PASSWORD}}"',
    "kafka": 'kind = "kafka"\nbootstrap_servers = "{bootstrap}"\ntopic = "idem-out"',
    "files": 'kind = "files"\npath = "{workdir}/files"',
}


@pytest.mark.parametrize("kind", SINKS)
def test_first_write_then_replay_is_a_no_op(
    kind: str, spark: Any, kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, tmp_path: Path
) -> None:
    from streamproof.kafka_client import ensure_topic

    assert PG_PASSWORD_ENV in os.environ
    ensure_topic(kafka_broker.bootstrap_servers, "idem-in", 2)
    text = SINKS[kind].format(workdir=tmp_path, pg_port=streamproof_postgres.port,
                              bootstrap=kafka_broker.bootstrap_servers)  # fmt: skip
    spec = _spec(text, tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    sink.prepare(spark)
    first = _rows(spark, range(0, 40))

    assert sink.write(first, _batch(0, 40, 40)).rows_out == 40
    second = _rows(spark, range(40, 60))
    assert sink.write(second, _batch(1, 20, 60)).rows_out == 20
    held = sink.read(spark)
    assert held is not None
    rows_held = held.count()
    assert [commit.batch_id for commit in sink.commits()] == [0, 1]

    # A new process replays batches 0 and 1 (a checkpoint backup from before them restored): nothing is written
    # again, for the second replay of the run as for the first.
    again = open_sink(spec, spec.sink_specs[0])
    for batch, rows in ((_batch(0, 40, 40), first), (_batch(1, 20, 60), second)):
        replay = again.write(rows, batch)
        assert replay.replay_skipped and replay.rows_out == 0, (batch.batch_id, replay)
    assert again.read(spark).count() == rows_held  # type: ignore[union-attr]

    # The next batch is written.
    assert again.write(_rows(spark, range(60, 80)), _batch(2, 20, 80)).rows_out == 20
    assert [commit.batch_id for commit in again.commits()] == [0, 1, 2]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("delta-append", "holds batch 0 of pipeline 'idem' with end offsets"),
        ("postgres-upsert", "holds batch 0 of pipeline 'idem' with end offsets"),
        ("kafka", "holds batch 0 of pipeline 'idem' with end offsets"),
        ("files", "holds batch 0 of pipeline 'idem' with end offsets"),
    ],
)
def test_a_replay_that_differs_from_the_recorded_batch_is_a_precise_error(
    kind: str, message: str, spark: Any, kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    from streamproof.kafka_client import ensure_topic

    ensure_topic(kafka_broker.bootstrap_servers, "idem-in", 2)
    text = SINKS[kind].format(workdir=tmp_path, pg_port=streamproof_postgres.port,
                              bootstrap=kafka_broker.bootstrap_servers)  # fmt: skip
    text = text.replace("idem_upsert", "idem_mismatch").replace('topic = "idem-out"', 'topic = "idem-mismatch"')
    spec = _spec(text, tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    sink.prepare(spark)
    sink.write(_rows(spark, range(0, 40)), _batch(0, 40, 40))

    sink.write(_rows(spark, range(40, 50)), _batch(1, 10, 50))

    # Batch 1 again, but not the records (or offsets) it had: a checkpoint that does not belong to the sink. Checked
    # for the second batch of a run as for the first.
    other = open_sink(spec, spec.sink_specs[0])
    assert other.write(_rows(spark, range(0, 40)), _batch(0, 40, 40)).replay_skipped
    with pytest.raises(Exception) as raised:
        other.write(_rows(spark, range(100, 130)), _batch(1, 30, 130))
    assert message.replace("batch 0", "batch 1") in str(raised.value)
    assert isinstance(raised.value, PipelineError)  # raised on the driver, before any share is written
    assert "nothing was written" in str(raised.value)


def test_delta_table_options_of_the_pipeline_file_are_set_on_the_table(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    sink_text = f'kind = "delta"\npath = "{tmp_path}/tuned"\noptimize_write = true\nauto_compact = true'
    spec = _spec(sink_text, tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    sink.prepare(spark)
    sink.prepare(spark)  # idempotent: a second start finds the table and the same options
    # Set once, as the table is created: a start that finds them set commits nothing (it committed every time).
    assert sorted(path.name for path in (tmp_path / "tuned" / "_delta_log").glob("*.json")) == [f"{0:020d}.json"]
    properties = DeltaTable.forPath(spark, str(tmp_path / "tuned")).detail().first()["properties"]
    assert properties["delta.autoOptimize.optimizeWrite"] == "true"
    assert properties["delta.autoOptimize.autoCompact"] == "true"
    assert properties["delta.checkpointInterval"] == "100"  # streamproof's default for new tables (jvm/session.py)
    assert sink.write(_rows(spark, range(0, 10)), _batch(0, 10, 10)).rows_out == 10


def test_a_delta_log_that_lost_a_checkpointed_version_is_read_again_once_its_stranded_files_are_set_aside(
    spark: Any, tmp_path: Path
) -> None:
    """Fault: the trailing commit file of a version Delta had also written a checkpoint of is deleted (the
    checkpoint, its pointer and the version's checksum stay). Expected: Delta itself then fails every read; the
    stranded files are found and set aside, and Delta reads the table at the last commit and appends after it.
    Planted too: the commit files the last commit needs lost with it (a restore is the only way): named."""
    from streamproof.sinks.delta_log import log_past_its_commits, set_aside_stranded
    from streamproof.storage.location import Location

    table = tmp_path / "orders"
    for version in range(3):  # versions 0-2, a checkpoint of 2
        frame = spark.range(version * 10, version * 10 + 10)
        writer = frame.write.format("delta").mode("append")
        if version == 0:
            writer = writer.option("delta.checkpointInterval", "2")
        writer.save(str(table))
    log = table / "_delta_log"
    assert (log / f"{2:020d}.checkpoint.parquet").exists()
    assert log_past_its_commits(Location(table)) is None  # a sound log
    for name in (f"{2:020d}.json", f".{2:020d}.json.crc"):
        (log / name).unlink()
    with pytest.raises(Exception, match="version"):  # Delta's own failure, which the repair removes
        spark.read.format("delta").load(str(table)).count()

    past = log_past_its_commits(Location(table))
    assert past is not None and past.last_commit == 1 and past.needs == ()
    assert f"{2:020d}.checkpoint.parquet" in past.stranded and "_last_checkpoint" in past.stranded
    assert f"{2:020d}.crc" in past.stranded

    planted = tmp_path / "planted"  # the same log, missing a commit file a read of version 1 needs
    shutil.copytree(table, planted)
    for name in (f"{0:020d}.json",):
        (planted / "_delta_log" / name).unlink()
    damaged = log_past_its_commits(Location(planted))
    assert damaged is not None and damaged.needs == (f"{0:020d}.json",)

    moved = set_aside_stranded(past, Location(table / "_streamproof_set_aside" / "rewind-1"))
    assert len(moved) == len(past.stranded) and all(Path(path).exists() for path in moved)
    assert spark.read.format("delta").load(str(table)).count() == 20  # versions 0-1
    spark.range(100, 105).write.format("delta").mode("append").save(str(table))
    assert spark.read.format("delta").load(str(table)).count() == 25
    assert log_past_its_commits(Location(table)) is None


def test_every_keyed_delta_append_decides_from_the_table_s_newest_commits_and_commits_through_the_transaction_api(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new table is created by Delta's writer; every later batch commits through Delta's transaction API without
    Delta's state rebuild. A new run replays batches 1 and 2 (an older checkpoint backup restored): both skipped, by
    the table's own commits, read once, back to the run's first batch only (not the whole log)."""
    import streamproof.sinks.delta as delta_sink
    import streamproof.sinks.delta_log as delta_log

    calls: list[tuple[str, int]] = []
    real_append, real_commit = delta_sink.append_batch, delta_sink.commit_keyed

    def appended(frame: Any, path: str, batch: Batch, **kwargs: Any) -> bool:
        calls.append(("writer", batch.batch_id))
        return real_append(frame, path, batch, **kwargs)

    def committed(txn: Any, frame: Any, batch: Batch, app: str | None = None) -> int:
        calls.append(("transaction", batch.batch_id))
        return real_commit(txn, frame, batch, app)

    monkeypatch.setattr(delta_sink, "append_batch", appended)
    monkeypatch.setattr(delta_sink, "commit_keyed", committed)
    spec = _spec(SINKS["delta-append"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    batches = [(range(0, 40), _batch(0, 40, 40)), (range(40, 60), _batch(1, 20, 60)),
               (range(60, 90), _batch(2, 30, 90))]  # fmt: skip
    for offsets, batch in batches:
        assert sink.write(_rows(spark, offsets), batch).rows_out == len(offsets)
    assert calls == [("writer", 0), ("transaction", 1), ("transaction", 2)]
    _rows(spark, range(90, 93)).write.format("delta").mode("append").save(str(tmp_path / "append"))  # another writer
    assert [(commit.batch_id, commit.keyed) for commit in sink.commits()] == [(0, True), (1, True), (2, True)]

    read: list[int] = []
    real_pipeline_commit = delta_log.pipeline_commit
    monkeypatch.setattr(delta_log, "pipeline_commit", lambda text, pipeline: read.append(1) or real_pipeline_commit(
        text, pipeline))  # fmt: skip
    calls.clear()
    again = open_sink(spec, spec.sink_specs[0])
    for offsets, batch in batches[1:]:
        assert again.write(_rows(spark, offsets), batch).replay_skipped
    assert calls == [] and again.read(spark).count() == 93  # type: ignore[union-attr]
    assert len(read) == 4  # versions 3 (another writer's), 2, 1, 0 (batch 0: the batch before the run's first)
    assert again.write(_rows(spark, range(90, 95)), _batch(3, 5, 95)).rows_out == 5
    assert calls == [("transaction", 3)] and len(read) == 4  # its own commits are not read again
    assert again.read(spark).count() == 98  # type: ignore[union-attr]


def test_the_quarantine_table_created_at_the_start_is_the_one_delta_s_writer_creates_and_batch_0_commits_into_it(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quarantine table created before the query starts (BatchWriter.create_quarantine_table) has the metadata
    and protocol the first append through Delta's writer gives a new table: every column nullable (the rows' are not),
    the session's default properties, a creation time. Batch 0's quarantined records then commit into it through the
    transaction API, its replay rule answered from the young table's log, without Delta's state rebuilt."""
    import streamproof.sinks.delta as delta_sink
    from streamproof.checkpoint.start import quarantine_table

    def described(table: Path) -> tuple[Any, ...]:
        actions = _log_of(table)
        metadata = next(action["metaData"] for action in actions if "metaData" in action)
        assert isinstance(metadata.pop("createdTime"), int) and metadata.pop("id")
        return metadata, next(action["protocol"] for action in actions if "protocol" in action)

    quarantined = _rows(spark, range(0, 40)).selectExpr(
        "_src_topic", "_src_partition", "_src_offset", "_src_timestamp", "coalesce(event_id, 'x') AS reason",
        "cast(order_id AS BINARY) AS raw_value")  # fmt: skip
    assert not quarantined.schema["reason"].nullable
    written, created = (_spec(SINKS["files"].format(workdir=tmp_path / name), tmp_path / name,
                              kafka_broker.bootstrap_servers) for name in ("written", "created"))  # fmt: skip
    quarantine_table(written).append(quarantined, _batch(0, 40, 40))
    calls: list[str] = []
    real_commit = delta_sink.commit_keyed
    monkeypatch.setattr(delta_sink, "commit_keyed", lambda *args: calls.append("transaction") or real_commit(*args))
    monkeypatch.setattr(delta_sink, "txn_version", lambda *args: pytest.fail("Delta's state rebuilt"))
    table = quarantine_table(created)
    table.create_table(spark, quarantined.schema)
    table.create_table(spark, quarantined.schema)  # there already: nothing committed
    assert described(Path(table.location)) == described(Path(quarantine_table(written).location))
    assert all(field["nullable"] for field in json.loads(described(Path(table.location))[0]["schemaString"])["fields"])
    assert table.append(quarantined, _batch(0, 40, 40)).rows_out == 40 and calls == ["transaction"]
    commits = [action["commitInfo"] for action in _log_of(Path(table.location)) if "commitInfo" in action]
    assert [commit["operation"] for commit in commits] == ["CREATE TABLE", "WRITE"]
    assert table.read(spark).count() == 40  # type: ignore[union-attr]
    assert table.append(quarantined, _batch(0, 40, 40)).replay_skipped


def test_a_few_rows_written_by_the_driver_are_the_file_and_statistics_delta_s_writer_makes(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's quarantined records gathered to the driver (a local relation) are written by the driver as one file
    (streamproof.sinks.delta_table.few_rows_file), without a Spark job, and committed as Delta's writer commits them:
    the same rows read back, the same Parquet schema, the same statistics (a timestamp's bounds to the millisecond,
    nulls counted, no bounds for binary), the same operation metrics. A string longer than Delta keeps in its
    statistics (32 characters) gets no bounds from the driver, where Delta's writer truncates them."""
    from datetime import datetime

    import pyarrow.parquet as pq

    import streamproof.sinks.delta as delta_sink
    from streamproof.checkpoint.start import quarantine_table
    from streamproof.pipeline.batches import BatchWriter
    from streamproof.transform.records import quarantined_records

    schema = ("_src_topic STRING, _src_partition INT, _src_offset BIGINT, _src_timestamp TIMESTAMP, "
              "_reject_reason STRING, _raw_value BINARY")  # fmt: skip
    # Topics past the ASCII range: the bounds follow Spark's string order (UTF-8 bytes), not UTF-16's.
    topics = ("orders", "orders-\uff5e", "orders-\U0001f600")
    rows = [(topics[i % 3], i % 3, 1_000 + i, datetime(2026, 1, 1, 0, 0, i % 60, 123_456 + i), f"invalid_json {i % 7}",
             None if i % 5 == 0 else f"{{{i}".encode()) for i in range(40)]  # fmt: skip
    rows.append(("orders", None, None, None, "schema", None))
    rows.append(("orders", 1, 999, datetime(2026, 1, 2), None, None))  # a valid record: not gathered
    longer = [*rows, ("orders", 2, 5_000, None, "missing_required:" + "a_field_name_longer_than_delta_keeps", b"{")]

    def written(name: str, records: list[Any], by_driver: bool) -> tuple[Any, ...]:
        spec = _spec(SINKS["files"].format(workdir=tmp_path / name), tmp_path / name, kafka_broker.bootstrap_servers)
        table = quarantine_table(spec)
        cached = spark.createDataFrame(records, schema).persist()
        gathered = BatchWriter._count(cached, None)["rejected_rows"]  # as a batch's counting gathers them
        cached.unpersist()
        frame = quarantined_records(gathered).coalesce(1)  # as the batch writer hands them to the table
        table.create_table(spark, frame.schema)
        quarantined = len(records) - 1
        with monkeypatch.context() as patched:
            if not by_driver:
                patched.setattr(delta_sink, "few_rows_file", lambda *args: None)
            spark.sparkContext.setJobGroup(name, name)
            assert table.append(frame, _batch(0, quarantined, 40)).rows_out == quarantined
            spark.sparkContext.setJobGroup("", "")
        jobs = list(spark.sparkContext.statusTracker().getJobIdsForGroup(name))
        actions = _log_of(Path(table.location))
        (add,) = [action["add"] for action in actions if "add" in action]
        metrics = next(action["commitInfo"] for action in actions if "commitInfo" in action and action["commitInfo"]
                       ["operation"] == "WRITE")["operationMetrics"]  # fmt: skip
        read = sorted(repr(tuple(row)) for row in table.read(spark).collect())  # type: ignore[union-attr]
        file_schema = pq.read_schema(Path(table.location) / add["path"])
        fields = {key: value for key, value in add.items() if key not in ("path", "modificationTime", "stats")}
        return json.loads(add["stats"]), read, file_schema, metrics, jobs, fields

    by_driver = written("driver", rows, by_driver=True)
    by_writer = written("writer", rows, by_driver=False)
    assert by_driver[0] == by_writer[0] and by_driver[0]["maxValues"]["_src_timestamp"] == "2026-01-01T00:00:39.123Z"
    assert by_driver[0]["maxValues"]["_src_topic"] == "orders-\U0001f600"
    assert by_driver[1] == by_writer[1] and len(by_driver[1]) == len(rows) - 1
    assert by_driver[2].remove_metadata() == by_writer[2].remove_metadata()
    assert (by_driver[3]["numFiles"], by_driver[3]["numOutputRows"]) == (by_writer[3]["numFiles"], "41")
    assert by_driver[4] == [] and by_writer[4] != []  # no Spark job for the driver's file
    assert by_driver[5] == by_writer[5]  # the AddFile's other fields: size, partition values, data change, tags
    driver_stats = written("driver-longer", longer, by_driver=True)[0]
    writer_stats = written("writer-longer", longer, by_driver=False)[0]
    assert "reason" not in driver_stats["minValues"] and "reason" in writer_stats["minValues"]
    for bounds in ("minValues", "maxValues"):
        writer_stats[bounds].pop("reason")
    assert driver_stats == writer_stats


def test_a_driver_written_file_s_time_bounds_are_delta_s_to_the_millisecond_within_years_1_to_9999(spark: Any) -> None:
    """A timestamp's bound in the statistics of a file the driver writes (dev.streamproof.delta.FewRowsFile) is
    Delta's: UTC, to the millisecond, truncated toward the past; a bound outside the years 1-9999 is left out (null
    here) rather than failing the commit."""
    few_rows = spark._jvm.dev.streamproof.delta.FewRowsFile
    assert few_rows.statsTime(1_700_000_000_123_456) == "2023-11-14T22:13:20.123Z"
    assert few_rows.statsTime(-1) == "1969-12-31T23:59:59.999Z"
    assert few_rows.statsTime(-62_135_596_800_000_000) == "0001-01-01T00:00:00.000Z"
    assert few_rows.statsTime(253_402_300_799_999_999) == "9999-12-31T23:59:59.999Z"
    assert few_rows.statsTime(-62_135_596_800_000_001) is None
    assert few_rows.statsTime(253_402_300_800_000_000) is None
    assert few_rows.statsTime(1_700_000_000_123_456_000) is None  # a time in nanoseconds read as microseconds


def test_batch_0_replayed_into_a_table_another_writer_restored_before_the_pipeline_wrote_it_is_not_written_twice(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A table of 12 versions another writer RESTOREd before the pipeline's first batch: batch 0 is committed under
    the appId marked with that RESTORE (streamproof.sinks.delta_log.app_id). A run killed before Spark's commit replays
    batch 0; the new run's start meets the pipeline's commit before the RESTORE, and its first batch asks Delta's own
    state whether the pipeline wrote the table (the table is not young): every appId of the pipeline counts, the
    marked one too, so the replay is skipped, not written a second time."""
    path = tmp_path / "append"
    for version in range(12):
        _rows(spark, range(1000 + version, 1001 + version)).write.format("delta").mode("append").save(str(path))
    spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF 5")
    spec = _spec(SINKS["delta-append"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    first = open_sink(spec, spec.sink_specs[0])
    first.read_at_start(spark, last_record=True, holdings=True)
    assert first.write(_rows(spark, range(0, 40)), _batch(0, 40, 40)).rows_out == 40
    again = open_sink(spec, spec.sink_specs[0])  # the run after the kill
    again.read_at_start(spark, last_record=True, holdings=True)
    assert again.write(_rows(spark, range(0, 40)), _batch(0, 40, 40)).replay_skipped
    assert again.read(spark).where("_src_offset < 40").count() == 40  # type: ignore[union-attr]


def test_a_delta_batch_whose_columns_changed_type_is_refused_in_one_line(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The transaction API writes files without the schema checks of Delta's writer: a batch whose columns are not
    the table's goes through Delta's writer, which refuses a column whose type changed; nothing is written."""
    from pyspark.sql import functions as F

    spec = _spec(SINKS["delta-append"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    sink.write(_rows(spark, range(0, 10)), _batch(0, 10, 10))
    sink.write(_rows(spark, range(10, 20)), _batch(1, 10, 20))
    changed = _rows(spark, range(20, 30)).withColumn("amount", F.col("amount").cast("string"))
    with pytest.raises(PipelineError) as refused:
        sink.write(changed, _batch(2, 10, 30))
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'append'} refused batch 2: ") and "\n" not in message, message
    assert "amount" in message and "schema" in message
    assert spark.read.format("delta").load(str(tmp_path / "append")).count() == 20


def test_the_table_s_commits_are_read_back_to_the_run_s_first_batch_and_a_cleaned_up_log_is_told(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """:func:`batches_back_to` finds the pipeline's batches from a given one in the newest commit files, past other
    writers' commits, and says when the files ran out first (cleaned up behind a Delta checkpoint). Then Delta's own
    state decides: the table holds nothing of the pipeline from the run's first batch on (a new batch is written),
    or it does and the replay cannot be checked (refused, naming the repair)."""
    from streamproof.sinks.delta_log import batches_back_to
    from streamproof.storage.location import Location

    table = tmp_path / "append"
    spec = _spec(SINKS["delta-append"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    for batch_id in range(3):  # versions 0-2
        sink.write(_rows(spark, range(batch_id * 10, batch_id * 10 + 10)), _batch(batch_id, 10, batch_id * 10 + 10))
    other_writer = _rows(spark, range(100, 101)).write.format("delta").mode("append")
    other_writer.save(str(table))  # version 3
    found = batches_back_to(Location(table), "idem", 3, first_batch=1)
    assert sorted(found.commits) == [1, 2] and found.complete and found.read == 3  # stopped at batch 1's own commit
    assert batches_back_to(Location(table), "idem", 1, first_batch=0).commits.keys() == {0, 1}  # as of version 1
    assert batches_back_to(Location(table), "other", 3, first_batch=0).commits == {}

    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")  # version 4
    other_writer.save(str(table))  # version 5
    other_writer.save(str(table))  # version 6
    assert (table / "_delta_log" / f"{6:020d}.checkpoint.parquet").exists()
    for version in range(4):
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    cleaned = batches_back_to(Location(table), "idem", 6, first_batch=1)
    assert cleaned.commits == {} and not cleaned.complete

    # A new run whose first batch is 3: the table holds up to batch 2 (Delta's own state says), nothing from 2 on
    # needs checking: written. One whose first batch is 2 replays a batch whose commit is gone: refused.
    assert open_sink(spec, spec.sink_specs[0]).write(_rows(spark, range(30, 40)), _batch(3, 10, 40)).rows_out == 10
    with pytest.raises(PipelineError, match=r"holds batches of pipeline 'idem' up to 3, and the commit files of some "
                                            r"from batch 2 on are cleaned up .* checkpoint recover"):  # fmt: skip
        open_sink(spec, spec.sink_specs[0]).write(_rows(spark, range(20, 30)), _batch(2, 10, 30))


def _dated_rows(spark: Any, batch: list[tuple[int, str, int]]) -> Any:
    """Rows ``(offset, order_id, day of January)``: the record's event date is its partition."""
    from datetime import datetime

    rows = [(f"e{offset}", order, float(offset), datetime(2026, 1, day, 12), "idem-in", offset % 2, offset,
             datetime(2026, 1, 1)) for offset, order, day in batch]  # fmt: skip
    return spark.createDataFrame(rows, ROW_SCHEMA)


def test_a_partitioned_delta_sink_writes_its_partitions_and_a_merge_reads_only_the_batch_s(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """Partitioned by a derived column (the event's date). Append: the first write creates the partitions, the
    later ones (Delta's transaction API) write into them. MERGE: a batch touching one day looks for its keys in
    that day's files only (Delta's own skipping metrics show it), updates in place, and a replay is skipped.
    A table partitioned otherwise than the file says is refused in one line."""
    from delta.tables import DeltaTable

    from streamproof.transform.records import with_derived_columns

    def opened(sink_text: str) -> Any:
        derived = 'columns = {event_date = "to_date(event_time)"}'
        spec = _spec(sink_text, tmp_path, kafka_broker.bootstrap_servers, derived)
        sink = open_sink(spec, spec.sink_specs[0])
        sink.refuse_unfit(spark)  # as open_batch_path asks it, before it prepares any sink
        sink.prepare(spark)
        return sink, spec

    def write(sink: Any, spec: Any, batch_id: int, rows: list[tuple[int, str, int]]) -> Any:
        frame = with_derived_columns(_dated_rows(spark, rows), spec.transform)
        return sink.write(frame, _batch(batch_id, len(rows), rows[-1][0] + 1))

    day1, day2 = [(i, f"a{i}", 1) for i in range(0, 6)], [(i, f"b{i}", 2) for i in range(6, 12)]
    append, spec = opened(f'kind = "delta"\npath = "{tmp_path}/append"\npartition_by = ["event_date"]')
    write(append, spec, 0, day1)
    write(append, spec, 1, day2)  # through the transaction API: the table's partitioning applies
    files = spark.read.format("delta").load(f"{tmp_path}/append").inputFiles()
    assert {("event_date=2026-01-01" in f, "event_date=2026-01-02" in f) for f in files} == {(True, False),
                                                                                              (False, True)}

    merge_text = f'kind = "delta"\npath = "{tmp_path}/merge"\nmode = "merge"\nkey = "order_id"\n'
    merge, spec = opened(merge_text + 'partition_by = ["event_date"]')
    write(merge, spec, 0, day1 + day2)
    # Day 1's files are taken away while a batch of day-2 orders is merged: a MERGE that looked in them would fail.
    day1_files = list((tmp_path / "merge" / "event_date=2026-01-01").glob("*.parquet"))
    aside = tmp_path / "aside"
    aside.mkdir()
    for file in day1_files:
        file.rename(aside / file.name)
    write(merge, spec, 1, [(20 + i, f"b{i}", 2) for i in range(6, 9)])  # newer records of three day-2 orders
    for file in day1_files:
        (aside / file.name).rename(file)
    table = DeltaTable.forPath(spark, f"{tmp_path}/merge")
    last = table.history(1).first()
    assert last is not None and last["operation"] == "MERGE" and day1_files
    assert "2026-01-02" in last["operationParameters"]["predicate"], last["operationParameters"]
    assert int(last["operationMetrics"]["numTargetRowsUpdated"]) == 3, last["operationMetrics"]
    held = {row["order_id"]: row["_src_offset"] for row in table.toDF().collect()}
    assert len(held) == 12 and [held[f"b{i}"] for i in range(6, 12)] == [26, 27, 28, 9, 10, 11]

    again, spec = opened(merge_text + 'partition_by = ["event_date"]')  # a new run replays batch 1
    assert write(again, spec, 1, [(20 + i, f"b{i}", 2) for i in range(6, 9)]).replay_skipped
    refusal = r"partitioned by \['event_date'\] but \[sink\] partition_by is \['amount'\]: set partition_by"
    with pytest.raises(PipelineError, match=refusal):
        opened(merge_text + 'partition_by = ["amount"]')


def test_a_sink_whose_table_cannot_take_the_rows_is_refused_before_any_sink_is_prepared(
    spark: Any, kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, tmp_path: Path
) -> None:
    """A PostgreSQL table that stands without some of the pipeline's columns, named after a Delta sink that a start
    would create: the start is refused in one line, and the Delta table is not made (it was, before the refusal)."""
    import psycopg

    from streamproof.pipeline.batches import open_batch_path
    from streamproof.sinks import open_sinks

    spec = parse_pipeline(f"""
name = "unfit"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "unfit-in"
[transform]
schema = "{SCHEMA}"
[[sinks]]
label = "delta"
kind = "delta"
path = "{tmp_path}/made"
optimize_write = true
[[sinks]]
label = "pg"
kind = "postgres"
port = {streamproof_postgres.port}
password = "${{{PG_PASSWORD_ENV}}}"
table = "unfit_orders"
mode = "append"
""")
    (pg,) = [sink for sink in spec.sink_specs if isinstance(sink, PostgresSinkSpec)]
    with psycopg.connect(pg.conninfo(), autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS unfit_orders")
        connection.execute("CREATE TABLE unfit_orders (event_id text, order_id text)")
    with pytest.raises(PipelineError) as refusal:
        open_batch_path(spark, spec, open_sinks(spec), exactly_once=True)
    assert str(refusal.value).startswith("postgresql://") and "unfit_orders exists without column(s) amount" in str(
        refusal.value
    ), str(refusal.value)
    assert not (tmp_path / "made").exists()


def test_a_merge_into_a_table_of_other_columns_is_refused_in_one_line(spark: Any, kafka_broker: KafkaBroker,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    """A MERGE's UPDATE * / INSERT * set only the table's columns: a batch with a column the table lacks would lose it
    without a word, one whose column has another type would be cast. The MERGE path no longer runs createIfNotExists
    (which compared the schemas) on an existing table, so the sink compares them itself: both are one-line refusals
    naming both schemas, and nothing is written."""
    spec = _spec(f'kind = "delta"\npath = "{tmp_path}/merge"\nmode = "merge"\nkey = "order_id"', tmp_path,
                 kafka_broker.bootstrap_servers)  # fmt: skip
    batch = _rows(spark, range(3))
    tables = {
        "lacks the batch's amount": batch.drop("amount"),
        "has amount as a string": batch.withColumn("amount", batch["amount"].cast("string")),
        "has other columns": spark.createDataFrame([("o1", 1.0)], "order_id STRING, total DOUBLE"),
    }
    for case, table in tables.items():
        shutil.rmtree(tmp_path / "merge", ignore_errors=True)
        table.limit(0).write.format("delta").save(str(tmp_path / "merge"))
        sink = open_sink(spec, spec.sink_specs[0])
        sink.prepare(spark)
        refusal = r"merge has the columns struct<.+>, batch 0 has struct<.+>: a MERGE would drop the batch's columns"
        with pytest.raises(PipelineError, match=refusal) as refused:
            sink.write(batch, _batch(0, 3, 3))
        assert "\n" not in str(refused.value), case
        assert spark.read.format("delta").load(str(tmp_path / "merge")).count() == 0, case
    shutil.rmtree(tmp_path / "merge")
    batch.limit(0).write.format("delta").save(str(tmp_path / "merge"))  # the batch's own columns: merged
    sink = open_sink(spec, spec.sink_specs[0])
    sink.prepare(spark)
    assert sink.write(batch, _batch(0, 3, 3)).rows_out == 3
    assert spark.read.format("delta").load(str(tmp_path / "merge")).count() == 3


def _split(spark: Any, offsets: range, splits: int) -> Any:
    """Rows as Kafka gives them with ``min_partitions``: each source partition's offsets split into ranges."""
    from datetime import datetime

    rows = [(f"e{i}", f"o{i}", float(i), datetime(2026, 1, 1, 0, 0, i % 60), "idem-in", i % 2, i,
             datetime(2026, 1, 1)) for i in offsets]  # fmt: skip
    frame = spark.createDataFrame(rows, ROW_SCHEMA)
    return frame.repartitionByRange(splits, "_src_partition", "_src_offset").sortWithinPartitions("_src_offset")


@pytest.mark.parametrize("kind", ["postgres-append", "kafka"])
def test_a_batch_replayed_split_otherwise_is_never_written_twice(
    kind: str, spark: Any, kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, tmp_path: Path
) -> None:
    """A per-task sink keys each share of a batch by its first record, so a replay whose Kafka splits differ
    (``min_partitions`` raised after a crash) brings shares under keys never seen. Before, for both sinks, the replay
    of a batch held whole failed on its first share, and the share under a new key was written again meanwhile (10 of
    40 records twice, checked with the fix stashed). Held whole, the batch is now skipped; held in part (a kill between
    its shares), a replay whose splits overlap a share written before without being it is refused on the driver,
    before any task writes; with the setting put back the batch completes: every record once."""
    import psycopg

    from streamproof.kafka_client import ensure_topic
    from streamproof.sinks.kafka import TransactionalWriter, _as_records

    ensure_topic(kafka_broker.bootstrap_servers, "idem-in", 2)
    text = {
        "postgres-append": f'kind = "postgres"\nport = {streamproof_postgres.port}\ntable = "idem_split"\n'
        'mode = "append"\npassword = "${STREAMPROOF_PG_PASSWORD}"',
        "kafka": f'kind = "kafka"\nbootstrap_servers = "{kafka_broker.bootstrap_servers}"\ntopic = "idem-split"',
    }[kind]
    spec = _spec(text, tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    sink.prepare(spark)
    assert sink.write(_split(spark, range(0, 40), 2), _batch(0, 40, 40)).rows_out == 40

    replay = open_sink(spec, spec.sink_specs[0]).write(_split(spark, range(0, 40), 4), _batch(0, 40, 40))
    assert replay.replay_skipped and replay.rows_out == 0, replay

    # Batch 1 held in part: its share of source partition 0 committed (offsets 40-78), partition 1's not.
    first_split = _split(spark, range(40, 80), 2)
    if kind == "kafka":
        records = _as_records(first_split, None)
        (partition_0, _) = records.rdd.map(tuple).glom().collect()
        writer = TransactionalWriter(spec.sink_specs[0], "idem", tuple(records.columns), 1,
                                     {"idem-in": {"0": 80, "1": 80}})  # fmt: skip
        assert list(writer(0, iter(partition_0))) == [(0, 20, False)]
    else:
        sink.write(first_split, _batch(1, 40, 80))
        with psycopg.connect(spec.sink_specs[0].conninfo(), autocommit=True) as connection:
            connection.execute("DELETE FROM idem_split WHERE _src_partition = 1 AND _src_offset >= 40")
            connection.execute("DELETE FROM streamproof_ledger WHERE sink_table = 'idem_split' AND batch_id = 1 "
                               "AND source_key IN ('*', 'idem-in/1@41')")  # fmt: skip
    # Raised min_partitions: refused on the driver before any task writes (partition 1's new splits too, so that
    # the batch can complete once the setting is put back).
    with pytest.raises(PipelineError, match=r"batch 1 is held in part, and its replay is split otherwise than when it "
                                            r"was written: idem-in/0@40 \(offsets 40-58\) against the share "
                                            r"idem-in/0@40 written before \(offsets 40-78\)"):  # fmt: skip
        open_sink(spec, spec.sink_specs[0]).write(_split(spark, range(40, 80), 4), _batch(1, 40, 80))
    if kind == "kafka":  # the task's own guard, should a split pass the driver: the overlapping share alone
        (share_60,) = [rows for rows in _as_records(_split(spark, range(40, 80), 4), None).rdd.map(tuple).glom()
                       .collect() if rows and rows[0][3] == 0 and rows[0][4] > 40]  # fmt: skip
        with pytest.raises(PipelineError, match=r"overlaps its share idem-in/0@40 written before \(offsets 40-78\)"):
            list(writer(1, iter(share_60)))
    # The setting put back: the batch completes, the share held skipped; every record once.
    open_sink(spec, spec.sink_specs[0]).write(_split(spark, range(40, 80), 2), _batch(1, 40, 80))
    held = open_sink(spec, spec.sink_specs[0]).read(spark)
    assert held is not None
    ids = [row["event_id"] for row in held.select("event_id").collect()]
    assert len(ids) == len(set(ids)) == 80, (len(ids), len(set(ids)))


@pytest.mark.crash
def test_min_partitions_raised_after_a_kill_writes_nothing_twice(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path
) -> None:
    """As an operator meets it: a PostgreSQL append and a Kafka sink, 6,000 events in 4 partitions. The run is
    SIGKILLed after every sink committed batch 1 (before Spark's commit log); `min_partitions = 8` is set (two
    splits per partition); the next run finds batch 1 held by every sink, marks it done without running it (the
    start's own rule), and drains. 3,000 events more; a kill in the Kafka sink's write of their first batch (its
    last task, after others committed), the setting raised to 16: PostgreSQL holds the batch whole and skips it, and
    Kafka, holding it in part, refuses the new splits in one line before any task writes; the setting put back, the
    run drains. Both checkers: 0/0/0."""
    from conftest import assert_every_sink_clean, run_cli
    from streamproof.checkpoint.log import committed_batches
    from streamproof.config import load_pipeline
    from streamproof.faults import points as faults
    from streamproof.generator import generate
    from streamproof.harness.crashes import Harness
    from streamproof.reconcile.independent import disagreements, verify_independently

    generate(kafka_broker.bootstrap_servers, "splits", 6_000, partitions=4, malformed=0.0, seed=41)
    pipeline_file = tmp_path / "pipeline.toml"

    def write(min_partitions: str) -> None:
        pipeline_file.write_text(f"""
name = "splits"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "splits"
max_offsets_per_trigger = 1500
{min_partitions}
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
[[sinks]]
label = "pg"
kind = "postgres"
port = {streamproof_postgres.port}
password = "${{{PG_PASSWORD_ENV}}}"
table = "splits_orders"
mode = "append"
[[sinks]]
label = "kafka"
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "splits-out"
""")

    write("")
    harness = Harness(pipeline_file, tmp_path / "logs", emit=print)
    killed = harness.start(faults.ArmedCrash(faults.AFTER_SINK_COMMIT, 1))
    assert harness.wait_for_exit(killed) == -9
    write("min_partitions = 8")
    replayed = run_cli("run", str(pipeline_file), "--available-now", timeout=600)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert "batch 1: held by every sink with those offsets" in replayed.stdout, replayed.stdout

    generate(kafka_broker.bootstrap_servers, "splits", 3_000, partitions=4, malformed=0.0, seed=42)
    write("")
    killed_batch = committed_batches(tmp_path / "checkpoint")[-1] + 1  # the first of the new events
    killed = harness.start(faults.ArmedCrash(faults.MID_SINK_WRITE, killed_batch, "kafka"))
    assert harness.wait_for_exit(killed) == -9
    harness.finish()
    write("min_partitions = 16")
    refused = run_cli("run", str(pipeline_file), "--available-now", timeout=600)
    assert refused.returncode != 0, refused.stdout[-3000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is held in part, and its replay is split otherwise" in errors[0], (
        refused.stderr[-3000:])  # fmt: skip
    assert "kafka topic splits-out: batch" in errors[0] and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    write("")
    drained = run_cli("run", str(pipeline_file), "--available-now", timeout=600)
    assert drained.returncode == 0, drained.stderr[-3000:]
    reports = assert_every_sink_clean(spark, pipeline_file, 9_000)
    assert disagreements(reports, verify_independently(load_pipeline(pipeline_file))) == []
