"""Other writers on the pipeline's tables, tried as an operator would.

A RESTORE (delta-rs's ``DeltaTable.restore``, Spark's ``RESTORE TABLE``) leaves the pipeline's commit files in the
log while it removes their rows: read as they stand, they say the table holds batches it no longer holds, and the
next run exited 0 with the restored-away records missing (issue 40: 4,998 in its run). Expected now: the next start
is refused in one line naming the RESTORE and `checkpoint rewind`; the rewind replays the undone batches with their
original offsets; the sink ends 0 lost / 0 duplicated by both checkers. A RESTORE under a running sink stops it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from conftest import assert_every_sink_clean, run_cli, write_pipeline
from streamproof.config import load_pipeline
from streamproof.generator import generate
from streamproof.infra import KafkaBroker
from streamproof.reconcile.independent import disagreements, verify_independently

pytestmark = [pytest.mark.integration]


def _drained(broker: KafkaBroker, workdir: Path, name: str, events: int, malformed: float, seed: int,
             last_batch: int) -> Path:  # fmt: skip
    """The demo pipeline (3,100 offsets a batch) on ``events`` new records of its own topic, drained through the CLI
    to ``last_batch``: its pipeline file."""
    topic = f"{name}-orders"
    generate(broker.bootstrap_servers, topic, events, partitions=2, malformed=malformed, seed=seed)
    pipeline_file = write_pipeline(
        workdir, name=name, topic=topic, bootstrap=broker.bootstrap_servers, max_offsets=3_100
    )
    drained = run_cli("run", str(pipeline_file), "--available-now")
    assert drained.returncode == 0, drained.stderr[-2000:]
    assert f"batch {last_batch} committed" in drained.stdout, drained.stdout
    assert f"batch {last_batch + 1} committed" not in drained.stdout, drained.stdout
    return pipeline_file


def test_a_table_restored_by_another_writer_is_refused_at_start_then_rewound_and_nothing_is_lost(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    # 3,100 a batch: four batches of the 12,000 records and the producer's transaction markers, versions 0-3.
    pipeline_file = _drained(kafka_broker, tmp_path, "restored", 12_000, malformed=0.005, seed=21, last_batch=3)

    table = tmp_path / "tables" / "orders"
    DeltaTable(str(table)).restore(1)  # back to batch 1: batches 2 and 3 undone, their commit files still in the log

    refused = run_cli("run", str(pipeline_file), "--available-now")  # before the fix: exit 0, batches 2-3 missing
    assert refused.returncode == 2, refused.stdout[-2000:]
    message = refused.stderr.strip()
    assert message.startswith(f"error: sink delta ({table}) is behind the checkpoint: it holds batches up to 1, the "
                              "checkpoint committed up to batch 3, so batches 2-3"), message  # fmt: skip
    assert "(a RESTORE committed as version 4 brought it back to version 1, undoing versions 2-3)" in message
    assert "`streamproof checkpoint rewind" in message and "\n" not in message

    rewound = run_cli("checkpoint", "rewind", str(pipeline_file))
    assert rewound.returncode == 0, rewound.stderr[-2000:]
    assert "replayed batches 2-3" in rewound.stdout, rewound.stdout
    reports = assert_every_sink_clean(spark, pipeline_file, 12_000)
    assert disagreements(reports, verify_independently(load_pipeline(pipeline_file))) == []

def test_batches_a_restore_undid_are_merged_again_and_a_restore_under_a_running_sink_stops_it(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """In process, with the sink's own code, a MERGE sink (the append sink's replay is the test above). A MERGE and
    Delta's writer skip a batch whose transaction version Delta recorded for the appId, and a RESTORE keeps that
    record (checked: Delta said 3 after a restore to version 1, and skipped a MERGE of version 2 without a word):
    the replay of an undone batch must land all the same (under the pipeline's own appId, 10 of these 20 rows were
    missing)."""
    mode = "merge"
    from test_sink_idempotency import SINKS, _batch, _rows, _spec

    from streamproof.errors import PipelineError
    from streamproof.sinks import open_sink
    from streamproof.sinks.delta_log import Restore, commits_on_disk
    from streamproof.storage.location import Location

    text = SINKS[f"delta-{mode}"].format(workdir=tmp_path)
    spec = _spec(text, tmp_path, kafka_broker.bootstrap_servers)
    path = str(tmp_path / mode)
    batches = [(range(10 * n, 10 * n + 10), _batch(n, 10, 10 * n + 10)) for n in range(4)]
    sink = open_sink(spec, spec.sink_specs[0])
    for offsets, batch in batches:
        assert sink.write(_rows(spark, offsets, order=f"b{batch.batch_id}-"), batch).rows_out == 10
    held = spark.read.format("delta").load(path).count()
    version_of = {commit["batch_id"]: commit["version"] for commit in commits_on_disk(Location(path), "idem")}
    DeltaTable(path).restore(version_of[1])  # back to batch 1: batches 2-3 undone
    restore = Restore(version_of[3] + 1, version_of[1])
    undone = f"a RESTORE committed as version {restore.version} brought it back to version {restore.to}, undoing " \
             f"{restore.undid}"  # fmt: skip
    with pytest.raises(PipelineError) as stopped:  # the running sink's next batch
        sink.write(_rows(spark, range(40, 50), order="b4-"), _batch(4, 10, 50))
    assert str(stopped.value).startswith(f"{path} was restored while the pipeline ran: {undone} and with them "
                                         "batches 2-3 the checkpoint has committed"), str(stopped.value)  # fmt: skip

    replaying = open_sink(spec, spec.sink_specs[0])
    assert replaying.last_commit(spark).batch_id == 1  # type: ignore[union-attr]
    assert replaying.why_behind() == undone
    for offsets, batch in batches[2:]:  # `checkpoint rewind` replays them with their original offsets
        written = replaying.write(_rows(spark, offsets, order=f"b{batch.batch_id}-"), batch)
        assert (written.rows_out, written.replay_skipped) == (10, False)
    assert spark.read.format("delta").load(path).count() == held
    again = open_sink(spec, spec.sink_specs[0])  # a later run: the replayed batches are held, keyed
    assert [(commit.batch_id, commit.keyed) for commit in again.commits()] == [(0, True), (1, True), (2, True),
                                                                               (3, True)]  # fmt: skip
    for offsets, batch in batches[2:]:
        assert again.write(_rows(spark, offsets, order=f"b{batch.batch_id}-"), batch).replay_skipped
    assert again.write(_rows(spark, range(40, 50), order="b4-"), _batch(4, 10, 50)).rows_out == 10
    assert spark.read.format("delta").load(path).count() == held + 5  # keys b4-0 ... b4-4


def test_a_table_dropped_and_created_again_to_the_same_version_under_a_running_sink_stops_it(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """In process, with the sink's own code. The table is deleted and written again by another writer, up to the
    version the sink read last: the version numbers match, and the next keyed commit would start on Delta's cached
    snapshot of the old table and commit onto the new one (before: batch 3 was committed as the new table's version 3,
    without a word, the pipeline's batches 0-2 gone). Expected: the sink's next batch stops on the commit file that
    changed, one line, nothing written. (The other writer here is this process's session, whose Delta log cache then
    holds the new table: the old code's commit was on the new table's snapshot, not a stale one; either way the
    version numbers alone told nothing.)"""
    import shutil

    from test_sink_idempotency import SINKS, _batch, _rows, _spec

    from streamproof.errors import PipelineError
    from streamproof.sinks import open_sink

    spec = _spec(SINKS["delta-append"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    path = tmp_path / "append"
    sink = open_sink(spec, spec.sink_specs[0])
    for n in range(3):  # versions 0-2
        assert sink.write(_rows(spark, range(10 * n, 10 * n + 10)), _batch(n, 10, 10 * n + 10)).rows_out == 10
    shutil.rmtree(path)
    for n in range(3):  # another table at the same path, of the same columns, versions 0-2, other rows
        _rows(spark, range(100 + n, 101 + n)).write.format("delta").mode("append").save(str(path))
    with pytest.raises(PipelineError) as stopped:
        sink.write(_rows(spark, range(30, 40)), _batch(3, 10, 40))
    assert str(stopped.value).startswith(f"{path} was replaced while the pipeline ran: its commit file of version "), (
        str(stopped.value))
    assert "`streamproof checkpoint rewind" in str(stopped.value) and "\n" not in str(stopped.value)
    assert sorted(name for name in (path / "_delta_log").iterdir() if name.suffix == ".json")[-1].name == (
        f"{2:020d}.json")  # nothing committed onto the new table


def test_a_replaced_table_stops_the_head_check_and_a_server_away_does_not() -> None:
    """Without a JVM: the check before each batch reads every sink's head; a failure to read it means "unknown, look
    again next batch" (a PostgreSQL sink away says so as a PipelineError), and only a replaced table is an answer."""
    from types import SimpleNamespace

    from streamproof.errors import PipelineError, SinkReplaced
    from streamproof.pipeline.batches import BatchWriter

    def sink(error: Exception) -> Any:
        def head() -> int:
            raise error

        return SimpleNamespace(name="s", pipeline=SimpleNamespace(name="p"), head=head)

    assert BatchWriter._head(sink(PipelineError("cannot connect to postgresql://...: Connection refused"))) is None
    with pytest.raises(SinkReplaced):
        BatchWriter._head(sink(SinkReplaced("/t was replaced while the pipeline ran: ...")))


def test_a_merge_an_optimize_beside_it_beat_to_the_commit_runs_again_and_writes_its_batch_once(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """In process, with the sink's own code, a MERGE sink: batches 0-2 merged (a file each), then batch 3, whose rows,
    while the MERGE reads them, run an OPTIMIZE of the table with delta-rs (another writer, as a nightly compaction
    beside the stream), which commits first. Delta fails the MERGE (ConcurrentAppendException: before, the batch and
    its run ended there). Expected: the MERGE runs again on the compacted table, and each of the batch's 5 keys is
    held once."""
    from pyspark.sql import functions as F
    from test_sink_idempotency import SINKS, _batch, _rows, _spec

    from streamproof.sinks import open_sink

    spec = _spec(SINKS["delta-merge"].format(workdir=tmp_path), tmp_path, kafka_broker.bootstrap_servers)
    path, flag = str(tmp_path / "merge"), str(tmp_path / "optimized")
    sink = open_sink(spec, spec.sink_specs[0])
    for n in range(3):
        assert sink.write(_rows(spark, range(10 * n, 10 * n + 10), order=f"b{n}-"), _batch(n, 10, 10 * n + 10)).rows_out

    def optimize_once(order_id: str) -> str:  # runs in a Python worker, as the MERGE reads its source
        import os

        from deltalake import DeltaTable as Table

        if not os.path.exists(flag):
            open(flag, "w").close()
            Table(path).optimize.compact()
        return order_id

    rows = _rows(spark, range(30, 40), order="b3-").withColumn("order_id", F.udf(optimize_once, "string")("order_id"))
    written = sink.write(rows, _batch(3, 10, 40))
    assert (written.rows_out, written.replay_skipped) == (10, False)
    operations = [entry["operation"] for entry in sorted(DeltaTable(path).history(), key=lambda e: e["version"])]
    assert operations[-2:] == ["OPTIMIZE", "MERGE"], operations  # the compaction landed first
    table = spark.read.format("delta").load(path)
    assert table.count() == table.select("order_id").distinct().count() == 20


def test_rows_another_process_appends_and_deletes_are_counted_named_and_the_pipeline_runs_on(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """Tried as an operator would: the demo pipeline drained 6,000 records in 2 batches into Delta; then another
    process (delta-rs) appended 3 rows of a backfill to the table and deleted the rows of partition 0's first 10
    offsets; 3,000 records more arrive. Expected: the next run carries on (exit 0, batch 2 committed); ``verify``
    counts exactly what the other writer did, its 3 rows unexpected and the deleted rows lost, nothing duplicated,
    and names its commits; the independent checker agrees term by term."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from streamproof.reconcile import verify_pipeline

    pipeline_file = _drained(kafka_broker, tmp_path, "others", 6_000, malformed=0.0, seed=41, last_batch=1)

    table = str(tmp_path / "tables" / "orders")
    backfill = DeltaTable(table).to_pyarrow_table().slice(0, 3)
    backfill = backfill.set_column(
        backfill.schema.get_field_index("_src_topic"), "_src_topic", pa.array(["backfill"] * 3, pa.string())
    )
    write_deltalake(table, backfill, mode="append")  # version 2
    deleted = DeltaTable(table).delete("_src_partition = 0 AND _src_offset < 10")["num_deleted_rows"]  # version 3
    assert deleted > 0

    generate(kafka_broker.bootstrap_servers, "others-orders", 3_000, partitions=2, malformed=0.0, seed=42)
    carried_on = run_cli("run", str(pipeline_file), "--available-now")
    assert carried_on.returncode == 0, carried_on.stderr[-2000:]
    assert "batch 2 committed" in carried_on.stdout, carried_on.stdout

    spec = load_pipeline(pipeline_file)
    reports = verify_pipeline(spark, spec)
    (delta,) = [report for report in reports if report.sink == "delta"]
    assert (delta.lost, delta.duplicated, delta.unexpected) == (deleted, 0, 3), delta.to_json()
    assert delta.other_writers == ["version 2 WRITE", "version 3 DELETE"]
    assert "other writers changed this table (version 2 WRITE, version 3 DELETE)" in " ".join(delta.reasons)
    assert disagreements(reports, verify_independently(spec)) == []


@pytest.mark.crash
def test_the_nemesis_s_restores_of_the_table_by_another_writer_are_refused_rewound_and_end_clean(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """The nemesis's ``table-restore:N`` on the demo pipeline: Spark's ``RESTORE TABLE`` by another writer undoes the
    pipeline's newest batches between runs, twice, with a SIGKILL of the pipeline between them. Expected: each next
    start refuses naming ``checkpoint rewind`` (or replays what was lost), the rewind applied, and the end 0/0/0 by
    both checkers."""
    from streamproof.harness.daemons import Daemons
    from streamproof.harness.search import replay
    from streamproof.harness.sequence import parse_sequence

    pipeline_file = write_pipeline(
        tmp_path / "base", name="restored-by-another", topic="restored-by-another",
        bootstrap=kafka_broker.bootstrap_servers, max_offsets=1_000,
    )  # fmt: skip
    lines: list[str] = []
    sequence = parse_sequence("data=9,drain,table-restore:2,kill@1:0.5,table-restore:1,drain")
    outcome = replay(pipeline_file, sequence, spark=spark, workdir=tmp_path / "nemesis", daemons=Daemons(kafka_broker),
                     emit=lines.append)  # fmt: skip
    said = "\n".join(lines)
    print(said)
    assert outcome.failure is None, said
    assert said.count("RESTOREd to version") == 2 and "checkpoint rewind" in said, said
    assert "every sink 0/0/0, both checkers agree" in said
