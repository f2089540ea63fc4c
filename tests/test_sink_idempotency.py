"""Each sink's idempotency rule, three cases each: the first write lands, a replay of the batch writes
nothing, and a replay that does not match what the sink recorded for that batch is a precise error.

Real Delta, PostgreSQL, Kafka and Parquet; the batches are written directly with the sinks' own code.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamproof.config import parse_pipeline
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
    held = sink.read(spark)
    assert held is not None
    rows_after_first = held.count()
    assert [commit.batch_id for commit in sink.commits()] == [0]

    # A new process replays batch 0 (after a crash): nothing is written again.
    again = open_sink(spec, spec.sink_specs[0])
    replay = again.write(first, _batch(0, 40, 40))
    assert replay.replay_skipped and replay.rows_out == 0
    assert again.read(spark).count() == rows_after_first  # type: ignore[union-attr]

    # The next batch is written.
    assert again.write(_rows(spark, range(40, 60)), _batch(1, 20, 60)).rows_out == 20
    assert [commit.batch_id for commit in again.commits()] == [0, 1]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("delta-append", "holds batch 0 of pipeline 'idem' with end offsets"),
        ("postgres-upsert", "holds batch 0 of pipeline 'idem' with end offsets"),
        ("kafka", "holds batch 0 of pipeline 'idem' with end offsets"),
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

    # Batch 0 again, but not the records (or offsets) it had: a checkpoint that does not belong to the sink.
    other = open_sink(spec, spec.sink_specs[0])
    with pytest.raises(Exception) as raised:
        other.write(_rows(spark, range(100, 130)), _batch(0, 30, 130))
    assert message in str(raised.value)
    assert isinstance(raised.value, PipelineError)  # raised on the driver, before any share is written


def test_delta_table_options_of_the_pipeline_file_are_set_on_the_table(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    sink_text = f'kind = "delta"\npath = "{tmp_path}/tuned"\noptimize_write = true\nauto_compact = true'
    spec = _spec(sink_text, tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    sink.prepare(spark)
    sink.prepare(spark)  # idempotent: a second start finds the table and the same options
    properties = DeltaTable.forPath(spark, str(tmp_path / "tuned")).detail().first()["properties"]
    assert properties["delta.autoOptimize.optimizeWrite"] == "true"
    assert properties["delta.autoOptimize.autoCompact"] == "true"
    assert properties["delta.checkpointInterval"] == "100"  # streamproof's default for new tables (session.py)
    assert sink.write(_rows(spark, range(0, 10)), _batch(0, 10, 10)).rows_out == 10


def test_a_delta_log_that_lost_a_checkpointed_version_is_read_again_once_its_stranded_files_are_set_aside(
    spark: Any, tmp_path: Path
) -> None:
    """Fault: the trailing commit file of a version Delta had also written a checkpoint of is deleted (the
    checkpoint, its pointer and the version's checksum stay). Expected: Delta itself then fails every read; the
    stranded files are found and set aside, and Delta reads the table at the last commit and appends after it.
    Planted too: the commit files the last commit needs lost with it (a restore is the only way): named."""
    from streamproof.sinks.delta import log_past_its_commits, set_aside_stranded
    from streamproof.storage import Location

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


def test_a_delta_append_after_the_first_of_a_run_commits_its_batch_key_without_delta_s_lookup(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first keyed append of a run reads the appId's version from the log (it may be a replay); the later ones
    commit the same SetTransaction without any lookup, and a new run's first append skips their replay."""
    import streamproof.sinks.delta as delta_sink

    calls: list[tuple[str, int]] = []
    for name in ("append_batch", "append_batch_checked", "append_batch_known_new"):
        real = getattr(delta_sink, name)

        def counted(frame: Any, path: str, batch: Batch, *args: Any, _real: Any = real, _name: str = name,
                    **kwargs: Any) -> Any:  # fmt: skip
            calls.append((_name, batch.batch_id))
            return _real(frame, path, batch, *args, **kwargs)

        monkeypatch.setattr(delta_sink, name, counted)
    spec = _spec(SINKS["delta-append"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    sink = open_sink(spec, spec.sink_specs[0])
    for batch_id, offsets in enumerate((range(0, 40), range(40, 60), range(60, 90))):
        assert sink.write(_rows(spark, offsets), _batch(batch_id, len(offsets), offsets.stop)).rows_out == len(offsets)
    # A new table is created by Delta's writer; then no lookup at all.
    assert calls == [("append_batch_checked", 0), ("append_batch", 0), ("append_batch_known_new", 1),
                     ("append_batch_known_new", 2)]  # fmt: skip
    assert [(commit.batch_id, commit.keyed) for commit in sink.commits()] == [(0, True), (1, True), (2, True)]

    calls.clear()
    again = open_sink(spec, spec.sink_specs[0])  # a new run replays batch 2: the log says the table holds it
    replay = again.write(_rows(spark, range(60, 90)), _batch(2, 30, 90))
    assert replay.replay_skipped and calls == [("append_batch_checked", 2)]
    assert again.read(spark).count() == 90  # type: ignore[union-attr]
    assert again.write(_rows(spark, range(90, 95)), _batch(3, 5, 95)).rows_out == 5
    assert calls[1:] == [("append_batch_known_new", 3)]
    assert again.read(spark).count() == 95  # type: ignore[union-attr]


def test_the_first_append_of_a_run_reads_the_app_id_s_version_from_the_log_and_leaves_doubt_to_delta(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`txn_version_in_log` answers as Delta would for the snapshot, or says it cannot tell; the checked append
    writes a new batch, skips a held one (a replay), and leaves it to Delta's own check when the log cannot tell
    (its commit files cleaned up behind a checkpoint)."""
    import streamproof.sinks.delta as delta_sink
    from streamproof.storage import Location

    table = tmp_path / "t"
    path = str(table)
    key = "streamproof/idem"
    checked, count = delta_sink.append_batch_checked, lambda: spark.read.format("delta").load(path).count()
    assert checked(_rows(spark, range(0, 10)), path, _batch(0, 10, 10))  # version 0, a new table: Delta's writer
    assert checked(_rows(spark, range(10, 20)), path, _batch(1, 10, 20))  # version 1
    assert checked(_rows(spark, range(20, 25)), path, Batch("other", 5, {}, keyed=True))  # 2: another appId's
    assert delta_sink.txn_version_in_log(Location(table), key, 2) == 1  # found behind the other appId's commit
    assert delta_sink.txn_version_in_log(Location(table), key, 0) == 0  # as of an older snapshot
    assert delta_sink.txn_version_in_log(Location(table), "streamproof/never", 2) == -1  # all read: never written
    assert delta_sink.txn_version_in_log(Location(table), key, 2, limit=1) is None  # not within the limit

    # Replays: the batch the log holds, and an older one, write nothing.
    assert not checked(_rows(spark, range(10, 20)), path, _batch(1, 10, 20))
    assert not checked(_rows(spark, range(0, 10)), path, _batch(0, 10, 10))
    assert count() == 25

    # A checkpoint at version 4, then the commit files it stands for cleaned up: the files cannot tell.
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")  # version 3
    assert checked(_rows(spark, range(25, 26)), path, Batch("other", 6, {}, keyed=True))  # version 4
    assert (table / "_delta_log" / f"{4:020d}.checkpoint.parquet").exists()
    for version in range(3):
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    assert delta_sink.txn_version_in_log(Location(table), key, 4) is None
    writer: list[int] = []
    real_writer = delta_sink.append_batch

    def spied(frame: Any, where: str, batch: Batch, **kwargs: Any) -> bool:
        writer.append(batch.batch_id)
        return real_writer(frame, where, batch, **kwargs)

    monkeypatch.setattr(delta_sink, "append_batch", spied)
    checked(_rows(spark, range(10, 20)), path, _batch(1, 10, 20))
    assert writer == [1] and count() == 26  # Delta's writer, which skipped the replay by its own lookup
    assert checked(_rows(spark, range(30, 35)), path, _batch(2, 5, 35)) and count() == 31


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

    from streamproof.transform import with_derived_columns

    def opened(sink_text: str) -> Any:
        derived = 'columns = {event_date = "to_date(event_time)"}'
        spec = _spec(sink_text, tmp_path, kafka_broker.bootstrap_servers, derived)
        sink = open_sink(spec, spec.sink_specs[0])
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
