"""A lost or damaged checkpoint is refused, never silently replayed, and rebuilt from what the sinks recorded.

Fault 1: SIGKILL of the pipeline's process tree inside the PostgreSQL sink's write of batch 1 (Delta already
holds batch 1, PostgreSQL holds part of it), then the checkpoint folder is deleted. Expected: the next run
is refused (exit 2, one line naming the sink and the way out); `checkpoint recover` rebuilds the
checkpoint; the run drains; both sinks reconcile 0 lost / 0 duplicated.
Fault 2: the last offset log file truncated (a torn write). Expected: refused with the file named (the check `run`
makes before Spark starts, called in process); recover keeps the damaged checkpoint aside; new events drain; both
sinks 0/0.
Fault 3: storage goes backwards: PostgreSQL restored from a backup two batches old (table and ledger), the Delta
table's and the quarantine table's trailing commits deleted (Delta's checkpoint of the sink's lost version stays).
Expected: the run is refused (exit 2, one line naming the sink behind, the batches and offsets it misses, and
`checkpoint rewind`); the rewind sets the stranded Delta checkpoint aside and replays the missing batches with their
original offsets into each; every sink 0/0 by both checkers. Then the whole quarantine table lost: refused, by the
mark the checkpoint keeps of the quarantine's last batch.
Fault 4: the source goes backwards: retention deletes records before they are read, then the topic is deleted and
created again. Expected: each start refused in one line with the partitions and offsets (exit 2), never a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from conftest import (
    REPO,
    assert_every_sink_clean,
    drain_in_process,
    plant_delta_commit,
    run_cli,
    run_lock_holder,
    taken_over_after_reading,
    tree_bytes,
    write_pipeline,
)
from streamproof.checkpoint.copies import backup
from streamproof.checkpoint.folder import RunLock
from streamproof.checkpoint.log import (
    DONE,
    batch_end_offsets,
    check_readable,
    committed_batches,
    logged_batches,
    next_batch_to_run,
    rebuild,
)
from streamproof.checkpoint.marks import QuarantineMark, RunCounter
from streamproof.checkpoint.positions import refuse_if_sink_behind, refuse_if_source_behind, rewind, sinks_behind
from streamproof.checkpoint.recover import recover, refuse_if_checkpoint_lost
from streamproof.checkpoint.start import read_sinks, starting_point
from streamproof.config import KafkaSource, PipelineSpec, PostgresSinkSpec, load_pipeline, parse_pipeline
from streamproof.errors import PipelineError
from streamproof.faults import points as faults
from streamproof.generator import generate
from streamproof.harness.crashes import Harness
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer
from streamproof.kafka_client import topic_end_offsets
from streamproof.pipeline.query import run as run_pipeline
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.sinks import open_sinks
from streamproof.sources import require_available
from streamproof.storage.claimed_log import ClaimedLog
from streamproof.storage.location import Location

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def _pipeline(workdir: Path, broker: KafkaBroker, postgres: PostgresServer) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    pipeline_file = workdir / "pipeline.toml"
    pipeline_file.write_text(f"""
name = "recovery"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "recovery"
max_offsets_per_trigger = 2000
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
quarantine = "{workdir}/quarantine"
[[sinks]]
label = "delta"
kind = "delta"
path = "{workdir}/orders"
[[sinks]]
label = "pg"
kind = "postgres"
port = {postgres.port}
password = "${{{PG_PASSWORD_ENV}}}"
table = "recovery_orders"
""")
    return pipeline_file


def _assert_clean(spark: Any, pipeline_file: Path, events: int) -> None:
    reports = assert_every_sink_clean(spark, pipeline_file, events)
    assert [report.sink for report in reports] == ["delta", "pg"]


def _a_start_meanwhile(checkpoint: Path) -> str:
    """What a run started now on ``checkpoint`` says (:func:`conftest.run_lock_holder`, lease 2 s, held 0.2 s)."""
    out, _ = run_lock_holder(checkpoint, 2, 0.2).communicate(timeout=60)
    return out.strip()


def test_lost_and_damaged_checkpoints_are_refused_then_rebuilt_from_the_sinks(
    kafka_broker: KafkaBroker,
    streamproof_postgres: PostgresServer,
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generate(kafka_broker.bootstrap_servers, "recovery", 6_000, partitions=4, malformed=0.005, seed=5)
    pipeline_file = _pipeline(tmp_path, kafka_broker, streamproof_postgres)
    checkpoint = tmp_path / "checkpoint"

    harness = Harness(pipeline_file, tmp_path / "logs", emit=print)
    crashed = harness.start(faults.ArmedCrash(faults.MID_SINK_WRITE, 1, "pg"))
    assert harness.wait_for_exit(crashed) == -9
    harness.finish()
    shutil.rmtree(checkpoint)

    refused = run_cli("run", str(pipeline_file), "--available-now", timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    message = refused.stderr.strip()
    assert message.startswith(f"error: checkpoint {checkpoint} is empty but {tmp_path / 'orders'} already holds")
    assert "streamproof checkpoint recover" in message and "\n" not in message

    started = time.monotonic()
    recovered = recover(spark, load_pipeline(pipeline_file))  # as the CLI calls it and prints (a JVM start saved;
    # the command itself: tests/test_foreach_batch.py's lost checkpoint)
    # Delta holds batch 1, PostgreSQL only part of it: batch 1 is re-run with the offsets Delta recorded.
    assert "each sink's last batch: {'delta': 1, 'pg': 0}" in recovered
    assert "re-runs batch 1" in recovered
    drained = drain_in_process(pipeline_file, monkeypatch)
    print(f"lost checkpoint: recover + drain took {time.monotonic() - started:.1f} s")
    assert "batch 1 committed" in drained and "batch 0 committed" not in drained
    _assert_clean(spark, pipeline_file, 6_000)

    shown = run_cli("checkpoint", "show", str(pipeline_file), timeout=300)
    assert shown.returncode == 0 and "what the sinks hold" in shown.stdout
    assert "│ delta " in shown.stdout and "│ pg " in shown.stdout

    # A torn write of the last offset file.
    last = checkpoint / "offsets" / str(logged_batches(checkpoint)[-1])
    last.write_text(last.read_text()[:40])
    generate(kafka_broker.bootstrap_servers, "recovery", 3_000, partitions=4, malformed=0.0, seed=6)
    spec = load_pipeline(pipeline_file)
    with pytest.raises(PipelineError) as refusal:  # as `run` checks the log before Spark starts (a process saved)
        check_readable(spec.checkpoint_dir, f"`streamproof checkpoint recover {pipeline_file}`")
    assert str(refusal.value).startswith(f"{last} is damaged (") and "checkpoint recover" in str(refusal.value)

    assert "the damaged checkpoint is kept as" in recover(spark, spec)  # as the CLI calls it (a JVM start saved)
    assert len(list(tmp_path.glob("checkpoint.damaged-*"))) == 1
    # The run on the rebuilt checkpoint is the next one below (its 3,000 new records with the 2,500 after them), and
    # both checkers count every record at the end.

    # Storage goes backwards: PostgreSQL restored from a backup taken now (table and ledger), some batches later;
    # and the Delta table's trailing commit gone (an object store or a restore lost it).
    (pg,) = [sink for sink in spec.sink_specs if isinstance(sink, PostgresSinkSpec)]
    with psycopg.connect(pg.conninfo(), autocommit=True) as connection:
        connection.execute("CREATE TABLE backup_orders AS SELECT * FROM recovery_orders")
        connection.execute("CREATE TABLE backup_ledger AS SELECT * FROM streamproof_ledger WHERE pipeline = 'recovery'")
    # The sink's lost version is one Delta had also written a checkpoint of (every version is, from here on): that
    # checkpoint stays and makes Delta itself fail every read until the rewind sets it aside. The quarantine's is not.
    for table, interval in (("orders", 1), ("quarantine", 1000)):
        properties = f"'delta.checkpointInterval' = '{interval}'"
        spark.sql(f"ALTER TABLE delta.`{tmp_path / table}` SET TBLPROPERTIES ({properties})")
    generate(kafka_broker.bootstrap_servers, "recovery", 2_500, partitions=4, malformed=0.02, seed=7)
    drain_in_process(pipeline_file, monkeypatch)
    with psycopg.connect(pg.conninfo(), autocommit=True) as connection:
        connection.execute("DELETE FROM recovery_orders")
        connection.execute("INSERT INTO recovery_orders SELECT * FROM backup_orders")
        connection.execute("DELETE FROM streamproof_ledger WHERE pipeline = 'recovery'")
        connection.execute("INSERT INTO streamproof_ledger SELECT * FROM backup_ledger")
    trailing = {}
    for table in ("orders", "quarantine"):  # the last batch had invalid records: its quarantine commit goes too
        log = tmp_path / table / "_delta_log"
        trailing[table] = max(int(path.name.split(".")[0]) for path in log.glob("*.json"))
        for suffix in ("json", "crc"):  # the commit and its checksum (a checkpoint of that version stays)
            (log / f"{trailing[table]:020d}.{suffix}").unlink(missing_ok=True)
    refused = run_cli("run", str(pipeline_file), "--available-now", timeout=300)
    assert refused.returncode == 2, refused.stdout[-2000:]
    message = refused.stderr.strip()
    assert message.startswith(f"error: sink delta ({tmp_path / 'orders'}) is behind the checkpoint: it holds batches "
                              "up to"), message  # fmt: skip
    assert "streamproof checkpoint rewind" in message and "source offsets from" in message and "\n" not in message
    lags = sinks_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    behind = {lag.sink.name: lag.holds_through for lag in lags}
    assert set(behind) == {"delta", "pg", "quarantine"}, behind
    rewound = run_cli("checkpoint", "rewind", str(pipeline_file), timeout=600)
    assert rewound.returncode == 0, rewound.stderr[-2000:]
    # The trailing commit was deleted by hand: Hadoop's hidden checksum of it stayed, and would fail its rewrite.
    stray = f".{trailing['orders']:020d}.json.crc"
    assert stray in rewound.stdout and "stray checksum file(s)" in rewound.stdout, rewound.stdout
    assert "replayed batches" in rewound.stdout and "delta (from batch" in rewound.stdout
    assert "pg (from batch" in rewound.stdout and "quarantine (from batch" in rewound.stdout, rewound.stdout
    assert f"{trailing['orders']:020d}.checkpoint.parquet" in rewound.stdout and "of lost Delta versions" in (
        rewound.stdout), rewound.stdout  # fmt: skip
    reports = assert_every_sink_clean(spark, pipeline_file, 11_500)
    assert disagreements(reports, verify_independently(spec)) == []
    # The whole quarantine table lost: the checkpoint's mark says which batch it last received.
    (tmp_path / "quarantine").rename(tmp_path / "quarantine-aside")
    with pytest.raises(PipelineError) as refusal:  # as `run` refuses it before Spark starts
        refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    assert str(refusal.value).startswith(f"the quarantine table ({tmp_path / 'quarantine'}) is behind the checkpoint: "
                                         "it holds no batch"), str(refusal.value)  # fmt: skip
    (tmp_path / "quarantine-aside").rename(tmp_path / "quarantine")

    # The checkpoint lost and rebuilt from the sinks (recover logs their newest batches only), then the Delta table's
    # two trailing commits lost: the rewind's first replayed batch starts where the table's own record of the batch
    # before it ends, an entry the offset log lost with the checkpoint (found by `prove --nemesis`).
    shutil.rmtree(checkpoint)
    # Both commands hold the run lock for their whole run: a start while they work (a real process taking the lock
    # as a run does) is refused naming the command.
    starts: list[str] = []
    import streamproof.checkpoint.recover as recover_module

    def reads_the_sinks_and_a_start_meanwhile(sinks: Any) -> Any:
        starts.append(_a_start_meanwhile(checkpoint))
        return real_recording(sinks)

    real_recording = recover_module.recording
    monkeypatch.setattr(recover_module, "recording", reads_the_sinks_and_a_start_meanwhile)
    recover(spark, spec)
    monkeypatch.setattr(recover_module, "recording", real_recording)
    log = tmp_path / "orders" / "_delta_log"
    newest = max(int(path.name.split(".")[0]) for path in log.glob("*.json"))
    for version in (newest, newest - 1):
        for name in (f"{version:020d}.json", f".{version:020d}.json.crc"):
            (log / name).unlink(missing_ok=True)
    lags = sinks_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    (delta_lag,) = [lag for lag in lags if lag.sink.name == "delta"]
    assert delta_lag.holds_through not in logged_batches(checkpoint), logged_batches(checkpoint)
    # As the command calls it (the command itself ran above), in this process: a JVM start saved.
    def replay_and_a_start_meanwhile(spec: PipelineSpec) -> None:
        starts.append(_a_start_meanwhile(checkpoint))
        run_pipeline(spec, once=True)

    replayed = rewind(spec, replay_and_a_start_meanwhile, spark)
    assert f"replayed batches {delta_lag.holds_through + 1}-" in replayed, replayed
    assert len(starts) >= 2 and starts[0].startswith(
        f"refused: {checkpoint} is in use by `streamproof checkpoint recover`"
    ) and all(line.startswith(f"refused: {checkpoint} is in use by `streamproof checkpoint rewind`")
              for line in starts[1:]), starts  # fmt: skip
    reports = assert_every_sink_clean(spark, pipeline_file, 11_500)
    assert disagreements(reports, verify_independently(spec)) == []

    # Retention deletes what partition 0 held and the pipeline read: the sinks hold rows the source no longer has.
    # They are unavailable, set aside (not unexpected) by both checkers, and the rest still reconciles.
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    read = batch_end_offsets(checkpoint, committed_batches(checkpoint)[-1])["recovery"]["0"]
    for future in admin.delete_records([TopicPartition("recovery", 0, read)]).values():
        future.result(timeout=30)
    reports = verify_pipeline(spark, spec)
    assert disagreements(reports, verify_independently(spec)) == []
    for report in reports:
        assert report.source_records == 11_500 - read and report.unavailable > 0, report.to_json()
        assert (report.lost, report.duplicated, report.unexpected, report.verdict) == (0, 0, 0, "ok"), report.to_json()
        assert any("unavailable, not compared" in reason for reason in report.reasons)
    # The source goes backwards. Retention deletes new records of partition 0 before the pipeline reads them.
    generate(kafka_broker.bootstrap_servers, "recovery", 1_000, partitions=4, malformed=0.0, seed=9)
    end = topic_end_offsets(kafka_broker.bootstrap_servers, "recovery")[0]
    for future in admin.delete_records([TopicPartition("recovery", 0, end)]).values():
        future.result(timeout=30)
    with pytest.raises(PipelineError) as refusal:  # as `run` refuses it before Spark starts (a process start saved)
        refuse_if_source_behind(spec, starting_point(spec), require_available(spec))
    assert str(refusal.value) == (
        f"topic recovery deleted records before this pipeline read them (retention): partition 0: offsets "
        f"{read}-{end - 1} ({end - read:,} records); exactly-once cannot continue past a gap in the source: raise the "
        "topic's retention and restore the records, or accept the loss by starting on a new checkpoint (`verify` "
        "reports them as unavailable)"
    )
    # The topic deleted and created again: its offsets start from 0, below what the checkpoint read.
    for future in admin.delete_topics(["recovery"]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 60
    while "recovery" in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.5)
    generate(kafka_broker.bootstrap_servers, "recovery", 100, partitions=4, malformed=0.0, seed=10)
    with pytest.raises(PipelineError) as refusal:
        refuse_if_source_behind(spec, starting_point(spec), require_available(spec))
    message = str(refusal.value)
    assert message.startswith(f"topic recovery is behind the checkpoint {checkpoint}: partition 0 ends at "
                              "offset "), message  # fmt: skip
    assert "the topic was deleted and recreated, or truncated" in message and "\n" not in message


def test_backup_and_restore_are_refused_while_a_pipeline_runs_on_the_checkpoint(tmp_path: Path) -> None:
    import subprocess

    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (checkpoint / RunLock.NAME).write_text(str(holder.pid))
        with pytest.raises(PipelineError, match=f"while a pipeline runs on it \\(pid {holder.pid}\\)"):
            backup(checkpoint)
    finally:
        holder.kill()
        holder.wait()
    copy = backup(checkpoint)  # the holder is gone: its lock file is stale
    assert (copy / "offsets").is_dir() and not (copy / RunLock.NAME).exists()


def _one_delta_sink(tmp_path: Path, name: str, dedup: bool = False) -> PipelineSpec:
    """A pipeline of one Delta sink under ``tmp_path`` (topic and name ``name``), for the tests without a JVM."""
    state = 'dedup = { columns = ["event_id"], watermark = "event_time", delay = "1 hour" }' if dedup else ""
    return parse_pipeline(f"""
name = "{name}"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
topic = "{name}"
[transform]
schema = "{'event_id STRING, event_time TIMESTAMP' if dedup else 'event_id STRING'}"
quarantine = "{tmp_path}/quarantine"
{state}
[sink]
kind = "delta"
path = "{tmp_path}/orders"
""")


def test_a_torn_quarantine_mark_is_refused_never_taken_for_no_mark(tmp_path: Path) -> None:
    """The checkpoint's quarantine mark tells a quarantine table that lost commits (its own log cannot). Each mark is
    a new entry created only if absent, so a crash leaves the old mark or the new; one damaged all the same (and the
    single file of older versions, torn) stops the start in one line, where it used to read as "no mark" and turn the
    check off."""

    spec = _one_delta_sink(tmp_path, "marked")
    (tmp_path / "checkpoint" / "commits").mkdir(parents=True)
    (tmp_path / "checkpoint" / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    mark = QuarantineMark(Location(tmp_path / "checkpoint"))
    mark.path.write_text("")  # the older versions' single file, torn: truncated, never written
    for damaged, says in ((mark.path, "'' is not a batch id"), (None, "'' is not a record")):
        if damaged is None:
            mark.path.delete()  # as the refusal says
            mark.record(0)
            assert mark.read() == 0
            entries = list((tmp_path / "checkpoint" / QuarantineMark.FOLDER).iterdir())
            assert [entry.name for entry in entries] == [f"{0:020d}.json"], entries  # nothing written aside is left
            damaged = Location(entries[0])
            entries[0].write_text("")
        with pytest.raises(PipelineError) as refusal:
            refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
        message = str(refusal.value)
        assert message.startswith(f"{damaged} is damaged ({says})") and "\n" not in message, message


def test_a_run_that_lost_its_lease_never_sets_the_quarantine_mark_back(tmp_path: Path) -> None:
    """Run A marks batch 3 and is paused; run B takes over (its claim on the mark made at its start) and marks batch
    5. A, woken, never sets the mark back to its own batch: once when it reads the mark after B's claim (it finds B's
    lease in it), once when it read the mark before B's claim and writes after it (the entry's name is taken: the
    store refuses the create). Before, the mark was one file renamed over: A's batch 4 replaced B's 5, and a quarantine
    table that lost batch 5 would have passed the start's check."""
    checkpoint = Location(tmp_path / "checkpoint")
    a = QuarantineMark(checkpoint)
    a.fence("a" * 32)
    a.record(3)
    b = QuarantineMark(checkpoint)
    b.fence("b" * 32)
    b.record(5)
    with pytest.raises(PipelineError, match=r"^this run lost its lease: .* another run \(lease bbbbbbbb\)"):
        a.record(4)
    assert QuarantineMark(checkpoint).read() == 5

    # B's read before a takeover, its write after it.
    c = QuarantineMark(checkpoint)
    b._newest = taken_over_after_reading(b._newest, lambda: c.fence("c" * 32))  # type: ignore[method-assign]
    with pytest.raises(PipelineError, match=r"^this run lost its lease: .* another run \(lease cccccccc\)"):
        b.record(6)
    assert QuarantineMark(checkpoint).read() == 5
    c.record(7)  # the holder goes on
    assert QuarantineMark(checkpoint).read() == 7

    # C read the mark, then slept while E took over and made more entries than are kept: the name after C's read is
    # free again (pruned) and C's create of it is made, but it is not the newest entry, and C stops all the same.
    stale = c._newest()
    e = QuarantineMark(checkpoint)
    e.fence("e" * 32)
    for batch in range(8, 8 + ClaimedLog.KEPT + 1):
        e.record(batch)
    c._newest = lambda: stale  # type: ignore[method-assign]
    with pytest.raises(PipelineError, match=r"^this run lost its lease: .* another run \(lease eeeeeeee\)"):
        c.record(99)
    assert QuarantineMark(checkpoint).read() == 8 + ClaimedLog.KEPT


def test_a_delta_log_holding_files_past_its_last_commit_is_refused_even_when_not_behind(tmp_path: Path) -> None:
    """Storage lost the table's newest commit, of a batch the checkpoint has not committed (a restored checkpoint, a
    kill after the sink's commit), while the Delta checkpoint written at that version stayed: the sink is not behind
    the checkpoint, yet Delta would fail every read with a JVM error. The start stops in one line naming rewind, and
    rewind sets the stranded files aside (nothing to replay: the next run re-runs the batch)."""

    spec = _one_delta_sink(tmp_path, "stranded")
    log = tmp_path / "orders" / "_delta_log"
    log.mkdir(parents=True)
    for batch_id in range(2):  # versions 0-1: batches 0-1; version 2 (batch 2) lost, its checkpoint kept
        plant_delta_commit(log, batch_id, pipeline="stranded", batch_id=batch_id, end_offsets={"t": {"0": batch_id}})
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"PAR1")
    (log / "_last_checkpoint").write_text('{"version": 2, "size": 3}')
    (tmp_path / "checkpoint" / "commits").mkdir(parents=True)
    for batch_id in range(2):
        (tmp_path / "checkpoint" / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    with pytest.raises(PipelineError) as refusal:
        refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    message = str(refusal.value)
    assert message.startswith(f"sink delta ({tmp_path / 'orders'}) has files of versions past its last commit "
                              "(version 1) in its log: ") and "checkpoint rewind" in message, message  # fmt: skip
    done = rewind(spec, lambda _: None)
    assert done.startswith(f"every sink holds every batch {tmp_path / 'checkpoint'} committed; set aside 2 file(s)")
    assert sorted(path.name for path in log.iterdir()) == [f"{0:020d}.json", f"{1:020d}.json"]
    # Readable again: nothing to refuse.
    refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))


def test_the_quarantine_table_is_named_as_itself_in_the_start_s_refusal_of_its_lost_versions(tmp_path: Path) -> None:
    """The quarantine table is read as a Delta sink is; a message names it as the quarantine table, never as a sink
    (its label is "quarantine", which a sink may bear too)."""
    spec = _one_delta_sink(tmp_path, "named")
    for table in ("orders", "quarantine"):  # both hold batches 0-1, as the checkpoint committed them
        for batch_id in range(2):
            plant_delta_commit(tmp_path / table / "_delta_log", batch_id, pipeline="named", batch_id=batch_id,
                               end_offsets={"t": {"0": batch_id}})  # fmt: skip
    log = tmp_path / "quarantine" / "_delta_log"  # version 2 (batch 2) lost, its checkpoint kept
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"PAR1")
    (log / "_last_checkpoint").write_text('{"version": 2, "size": 3}')
    rebuild(spec.checkpoint_dir, {b: {"named": {"0": b}} for b in range(2)}, committed_through=1)
    with pytest.raises(PipelineError) as refusal:
        refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    assert str(refusal.value).startswith(
        f"the quarantine table ({tmp_path / 'quarantine'}) has files of versions past its last commit (version 1)"
    ), str(refusal.value)


def _rewind_pipeline(tmp_path: Path, broker: KafkaBroker, name: str, tables: tuple[str, ...]) -> PipelineSpec:
    """A pipeline of Delta sinks ``tables`` under ``tmp_path`` (its file: ``pipeline.toml`` there), reading a new topic
    of 30 records (one partition) on the real broker, for the tests on planted Delta logs."""
    topic = f"{name}-{time.time_ns()}"
    generate(broker.bootstrap_servers, topic, 30, partitions=1, malformed=0.0, seed=1)
    sinks = "".join(f'[[sinks]]\nlabel = "{table}"\nkind = "delta"\npath = "{tmp_path}/{table}"\n' for table in tables)
    text = f"""
name = "{name}"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "{topic}"
[transform]
schema = "event_id STRING"
quarantine = "{tmp_path}/quarantine"
{sinks}"""
    (tmp_path / "pipeline.toml").write_text(text)
    return parse_pipeline(text)


def _ends(spec: PipelineSpec, batch_id: int) -> dict[str, dict[str, int]]:
    """Where batch ``batch_id`` of a :func:`_rewind_pipeline` ends: 10 records a batch."""
    assert isinstance(spec.source, KafkaSource)
    return {spec.source.topic: {"0": (batch_id + 1) * 10}}


def test_a_start_whose_sinks_hold_batches_beyond_the_checkpoint_with_a_gap_is_refused_before_it_is_counted(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    """An older checkpoint restored under sinks that hold batches 2 and 4 beyond it, and none batch 3: the run is
    refused in one line before it counts a start or opens the batch path (which creates what a sink lacks); it used
    to be refused only when it came to replay them."""
    spec = _rewind_pipeline(tmp_path, kafka_broker, "gapped", ("orders",))
    for version, batch_id in enumerate((0, 1, 2, 4)):
        log = tmp_path / "orders" / "_delta_log"
        plant_delta_commit(log, version, pipeline="gapped", batch_id=batch_id, end_offsets=_ends(spec, batch_id))
    rebuild(spec.checkpoint_dir, {b: _ends(spec, b) for b in range(2)}, committed_through=1)
    refused = run_cli("run", str(tmp_path / "pipeline.toml"), "--available-now", timeout=300)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(  # after the JVM's own warning
        "error: the sinks of pipeline 'gapped' hold batches [2, 4] beyond the checkpoint's last committed batch 1 but "
        "none holds batch(es) [3]"
    ), refused.stderr[-2000:]
    assert not (tmp_path / "checkpoint" / RunCounter.NAME).exists()


def test_a_rewind_refuses_a_table_whose_log_lost_commit_files_only_a_lost_version_s_checkpoint_stood_for(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    """docs/operations.md: storage lost a Delta version Delta had written a checkpoint of, and the commit files
    before it had gone already (log clean-up). No replay brings the table back to its last commit, so
    `checkpoint rewind` refuses in one line naming the files, and changes nothing."""
    spec = _rewind_pipeline(tmp_path, kafka_broker, "unreadable", ("orders",))
    log = tmp_path / "orders" / "_delta_log"
    for batch_id in range(3):  # versions 0-2: batches 0-2, all committed by the checkpoint
        plant_delta_commit(log, batch_id, pipeline="unreadable", batch_id=batch_id, end_offsets=_ends(spec, batch_id))
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"PAR1")
    (log / "_last_checkpoint").write_text('{"version": 2, "size": 3}')
    rebuild(spec.checkpoint_dir, {b: _ends(spec, b) for b in range(3)}, committed_through=2)
    for version in (2, 0):  # version 2 lost, its checkpoint kept; version 0 gone before (only that checkpoint had it)
        (log / f"{version:020d}.json").unlink()
    before = tree_bytes(Location(tmp_path))
    with pytest.raises(PipelineError) as refusal:
        rewind(spec, lambda _: pytest.fail("nothing may be replayed"))
    assert str(refusal.value) == (
        f"sink orders ({tmp_path / 'orders'}) cannot be read back to its last commit (version 1): its log also lost "
        f"{0:020d}.json in {log}, which only the checkpoint of a lost version stood for; restore those files (or the "
        "table) from a backup, then rewind"
    )
    assert tree_bytes(Location(tmp_path)) == before


def test_a_rewind_over_a_topic_that_ends_before_the_checkpoint_is_refused_before_the_checkpoint_is_set_back(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    """The sink lost its last commit, and the topic holds fewer records than the checkpoint read (recreated, or
    truncated): every replay's run would be refused at its start, after the rewind had set the checkpoint back. The
    rewind refuses first, in the start's own line, and changes nothing."""
    spec = _rewind_pipeline(tmp_path, kafka_broker, "shrunk", ("orders",))
    log = tmp_path / "orders" / "_delta_log"
    for batch_id in range(2):  # versions 0-1: batches 0-1; batch 2's version lost
        plant_delta_commit(log, batch_id, pipeline="shrunk", batch_id=batch_id, end_offsets=_ends(spec, batch_id))
    rebuild(spec.checkpoint_dir, {b: _ends(spec, b) for b in range(4)}, committed_through=3)  # read up to 40 of 30
    before = tree_bytes(Location(tmp_path))
    with pytest.raises(PipelineError) as refusal:
        rewind(spec, lambda _: pytest.fail("nothing may be replayed"))
    assert isinstance(spec.source, KafkaSource)
    assert str(refusal.value).startswith(
        f"topic {spec.source.topic} is behind the checkpoint {spec.checkpoint_dir}: partition 0 ends at offset 30, "
        "the checkpoint has read up to 40 (the topic was deleted and recreated, or truncated)"
    ), str(refusal.value)
    assert tree_bytes(Location(tmp_path)) == before


def test_a_rewind_of_a_pipeline_whose_source_folder_is_gone_is_refused_before_the_checkpoint_is_set_back(
    tmp_path: Path,
) -> None:
    """A files source: its folder gone, every replay's run would be refused at its start, after the rewind had set the
    checkpoint back. The rewind refuses first, in the start's own line, and changes nothing."""
    spec = parse_pipeline(f"""
name = "foldered"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "files"
path = "{tmp_path}/incoming"
[transform]
schema = "event_id STRING"
quarantine = "{tmp_path}/quarantine"
[sink]
kind = "delta"
path = "{tmp_path}/orders"
""")
    plant_delta_commit(tmp_path / "orders" / "_delta_log", 0, pipeline="foldered", batch_id=0, end_offsets={})
    rebuild(spec.checkpoint_dir, {b: {"t": {"0": b}} for b in range(2)}, committed_through=1)  # batch 1's commit lost
    before = tree_bytes(Location(tmp_path))
    with pytest.raises(PipelineError) as refusal:
        rewind(spec, lambda _: pytest.fail("nothing may be replayed"))
    assert str(refusal.value) == (
        f"source.path: folder {tmp_path / 'incoming'} does not exist: create it and put JSON-lines files in it"
    )
    assert tree_bytes(Location(tmp_path)) == before


def test_a_rewind_with_no_sink_behind_refuses_a_log_it_cannot_mend_rather_than_find_nothing_to_do(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    """The sink holds every batch the checkpoint committed, but lost the version of the next one, whose Delta
    checkpoint stayed, and its first commit file had gone before (log clean-up). The start refuses it, naming rewind;
    the rewind used to answer "nothing to rewind", a loop with no way out. It now refuses in one line, naming the
    files a restore must bring back, and changes nothing."""
    spec = _rewind_pipeline(tmp_path, kafka_broker, "looped", ("orders",))
    log = tmp_path / "orders" / "_delta_log"
    for batch_id in range(2):  # versions 0-1: batches 0-1, committed; version 2 (batch 2) lost, its checkpoint kept
        plant_delta_commit(log, batch_id, pipeline="looped", batch_id=batch_id, end_offsets=_ends(spec, batch_id))
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"PAR1")
    (log / "_last_checkpoint").write_text('{"version": 2, "size": 3}')
    (log / f"{0:020d}.json").unlink()
    rebuild(spec.checkpoint_dir, {b: _ends(spec, b) for b in range(2)}, committed_through=1)
    with pytest.raises(PipelineError, match="has files of versions past its last commit"):
        refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    before = tree_bytes(Location(tmp_path))
    with pytest.raises(PipelineError) as refusal:
        rewind(spec, lambda _: pytest.fail("nothing may be replayed"))
    assert str(refusal.value).startswith(
        f"sink orders ({tmp_path / 'orders'}) cannot be read back to its last commit (version 1): its log also lost "
        f"{0:020d}.json in {log}"
    ), str(refusal.value)
    assert tree_bytes(Location(tmp_path)) == before


def test_a_rewind_whose_first_records_retention_deleted_is_refused_changing_nothing(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    """A sink behind a checkpoint rebuilt by `recover` (which logs the newest batch only): the rewind takes where the
    first batch to replay starts from the sink's own record. When retention has deleted those records from the topic,
    it refuses in one line and leaves the checkpoint as it found it."""
    spec = _rewind_pipeline(tmp_path, kafka_broker, "retained", ("orders",))
    log = tmp_path / "orders" / "_delta_log"
    for batch_id in range(2):  # versions 0-1: batches 0-1; batch 2's version lost
        plant_delta_commit(log, batch_id, pipeline="retained", batch_id=batch_id, end_offsets=_ends(spec, batch_id))
    rebuild(spec.checkpoint_dir, {2: _ends(spec, 2)}, committed_through=2)
    assert isinstance(spec.source, KafkaSource)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(spec.source.topic, 0, 25)]).values():
        future.result(timeout=30)
    before = tree_bytes(Location(tmp_path))
    with pytest.raises(PipelineError) as refusal:
        rewind(spec, lambda _: pytest.fail("nothing may be replayed"))
    assert str(refusal.value) == (
        f"topic {spec.source.topic} no longer holds the records to replay: partition 0 from offset 20 (now starts at "
        "25); they are gone from the source (retention, or the topic was recreated): restore the sinks from a backup "
        "instead"
    )
    assert tree_bytes(Location(tmp_path)) == before


def test_a_rewind_sets_aside_the_lost_versions_of_a_sink_not_behind_which_its_replays_would_be_refused_for(
    tmp_path: Path, kafka_broker: KafkaBroker
) -> None:
    """Two sinks, each hit by its own loss: `a` lost its last commit (behind the checkpoint); `b` lost the version of a
    batch the checkpoint had not committed, whose Delta checkpoint stayed (not behind; Delta cannot read it). The
    rewind sets both logs' stranded files aside before replaying, so the replays' runs start: each replay here makes
    the checks a run makes at its start, then commits the batch as Spark would."""
    spec = _rewind_pipeline(tmp_path, kafka_broker, "both", ("a", "b"))
    for table in ("a", "b"):
        for batch_id in range(2):  # versions 0-1: batches 0-1
            log = tmp_path / table / "_delta_log"
            plant_delta_commit(log, batch_id, pipeline="both", batch_id=batch_id, end_offsets=_ends(spec, batch_id))
    rebuild(spec.checkpoint_dir, {b: _ends(spec, b) for b in range(2)}, committed_through=1)
    (tmp_path / "a" / "_delta_log" / f"{1:020d}.json").unlink()  # a: batch 1 lost
    (tmp_path / "b" / "_delta_log" / f"{2:020d}.checkpoint.parquet").write_bytes(b"PAR1")  # b: version 2 lost
    (tmp_path / "b" / "_delta_log" / "_last_checkpoint").write_text('{"version": 2, "size": 3}')
    replayed = []

    def replay(spec: PipelineSpec) -> None:
        held = read_sinks(None, open_sinks(spec), starting_point(spec))
        refuse_if_checkpoint_lost(spec, held)
        refuse_if_sink_behind(spec, held)  # what refused the replay before: b's stranded files
        batch = next_batch_to_run(spec.checkpoint_dir)
        plant_delta_commit(tmp_path / "a" / "_delta_log", batch, pipeline="both", batch_id=batch,
                           end_offsets=_ends(spec, batch))  # fmt: skip
        (spec.checkpoint_dir / "commits" / str(batch)).write_text(DONE)
        replayed.append(batch)

    done = rewind(spec, replay)
    assert replayed == [1], done
    assert "set aside 2 file(s) of lost Delta versions" in done and str(tmp_path / "b" / "_streamproof_set_aside") in (
        done), done  # fmt: skip
    assert sorted(path.name for path in (tmp_path / "b" / "_delta_log").iterdir()) == [
        f"{0:020d}.json",
        f"{1:020d}.json",
    ]


def _two_delta_sinks(tmp_path: Path, *, committed: int) -> PipelineSpec:
    """A pipeline of two Delta sinks ("a", "b") whose tables hold batches 0 to ``committed`` - 1 of it as Delta commit
    files, as the checkpoint committed them (none: an empty checkpoint), for the tests without a JVM."""
    spec = parse_pipeline(f"""
name = "twice"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
topic = "twice"
[transform]
schema = "event_id STRING"
quarantine = "{tmp_path}/quarantine"
[[sinks]]
label = "a"
kind = "delta"
path = "{tmp_path}/a"
[[sinks]]
label = "b"
kind = "delta"
path = "{tmp_path}/b"
""")
    for table in ("a", "b"):
        log = tmp_path / table / "_delta_log"
        log.mkdir(parents=True)
        for batch_id in range(2):
            plant_delta_commit(log, batch_id, pipeline="twice", batch_id=batch_id, end_offsets={"t": {"0": batch_id}})
    if committed:
        offsets = {batch_id: {"twice": {"0": batch_id}} for batch_id in range(committed)}
        rebuild(spec.checkpoint_dir, offsets, committed_through=committed - 1)
    return spec


def test_a_start_reads_each_sink_once_and_with_spark_only_those_it_could_not_read_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's refusals judge one reading of each sink: the checks made before Spark starts read those readable
    without it, and once Spark runs only the others are read (a table on HDFS or S3), then every refusal is judged
    again whole. Each read of a Delta table on S3 costs a dozen requests; they were made twice, and three times for a
    table's log. A sink read only once Spark runs is still refused when it is behind."""
    import streamproof.sinks.delta as delta_module
    from streamproof.sinks.delta import DeltaSink

    spec = _two_delta_sinks(tmp_path, committed=2)
    reads: dict[str, int] = {}
    real_last_commit, real_past, real_names = DeltaSink.last_commit, delta_module.log_past_its_commits, Location.names

    def count(what: str) -> None:
        reads[what] = reads.get(what, 0) + 1

    def last_commit(sink: DeltaSink, spark: Any, **latest: Any) -> Any:
        count(f"{sink.name} commits")
        return real_last_commit(sink, spark, **latest)

    def past(table: Location, **look: Any) -> Any:
        count(f"{table.name} log")
        return real_past(table, **look)

    def names(folder: Location) -> list[str]:
        if folder.name == "_delta_log":  # a young table's log: no Delta checkpoint, listed to find its head
            count(f"{folder.parent.name} listed")
        return real_names(folder)

    monkeypatch.setattr(DeltaSink, "last_commit", last_commit)
    monkeypatch.setattr(delta_module, "log_past_its_commits", past)
    sinks, start = open_sinks(spec), starting_point(spec)
    monkeypatch.setattr(sinks[1], "needs_spark_for_commits", lambda: True)  # as on S3, beside a local checkpoint
    monkeypatch.setattr(Location, "names", names)
    before_spark = read_sinks(None, sinks, start)
    refuse_if_checkpoint_lost(spec, before_spark)
    refuse_if_sink_behind(spec, before_spark)
    assert before_spark.unread
    once = {"commits": 1, "log": 1, "listed": 1}
    assert reads == {f"{table} {what}": n for table in ("a", "quarantine") for what, n in once.items()}, reads

    (tmp_path / "b" / "_delta_log" / f"{1:020d}.json").unlink()  # b lost its last commit: behind the checkpoint
    with_spark = read_sinks(cast(SparkSession, object()), sinks, start, earlier=before_spark)
    assert not with_spark.unread
    assert reads == {f"{table} {what}": n for table in ("a", "quarantine", "b") for what, n in once.items()}, reads
    refuse_if_checkpoint_lost(spec, with_spark)
    with pytest.raises(PipelineError) as refusal:
        refuse_if_sink_behind(spec, with_spark)
    message = str(refusal.value)
    behind = f"sink b ({tmp_path / 'b'}) is behind the checkpoint: it holds batches up to 0, "
    assert message.startswith(behind), message


def test_a_sink_whose_read_fails_never_hides_the_refusal_of_a_sink_named_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start reads every sink before it judges, and a read that fails keeps its error for the check that uses
    it: an empty checkpoint beside a sink holding batches is refused as a lost checkpoint, in the sinks' order, even
    when a sink named after it cannot be read; a failed read of the first sink still stops the start with its own
    line."""
    spec = _two_delta_sinks(tmp_path, committed=0)
    sinks, start = open_sinks(spec), starting_point(spec)

    def damaged(_spark: Any, **_latest: Any) -> Any:
        raise PipelineError("the records of sink b are damaged")

    monkeypatch.setattr(sinks[1], "last_commit", damaged)
    held = read_sinks(None, sinks, start)  # reads all, refuses nothing yet
    with pytest.raises(PipelineError) as refusal:
        refuse_if_checkpoint_lost(spec, held)
    message = str(refusal.value)
    assert message.startswith(f"checkpoint {tmp_path / 'checkpoint'} is empty but {tmp_path / 'a'} already holds "
                              "batches of pipeline 'twice' up to batch 1"), message  # fmt: skip

    sinks = open_sinks(spec)
    monkeypatch.setattr(sinks[0], "last_commit", damaged)
    with pytest.raises(PipelineError, match="the records of sink b are damaged"):
        refuse_if_checkpoint_lost(spec, read_sinks(None, sinks, start))


def test_recover_refuses_a_pipeline_whose_state_only_the_checkpoint_holds(tmp_path: Path) -> None:
    """Dedup's (and windows') state lives in the checkpoint alone: a checkpoint rebuilt from the sinks' records would
    start it empty (resent records seen before pass again), and its one-source offset log was refused by Spark's
    query, which reads the topic twice. Refused in one line, naming restore."""

    spec = _one_delta_sink(tmp_path, "stateful", dedup=True)
    with pytest.raises(PipelineError) as refusal:
        recover(None, spec)  # type: ignore[arg-type]  # refused before a session is needed
    message = str(refusal.value)
    assert message.startswith("checkpoint recover rebuilds the offset and commit logs from the sinks' records, not the "
                              "state of dedup or windows") and "checkpoint restore" in message, message  # fmt: skip


def test_a_damaged_log_gets_a_diagnosis_and_the_way_out(tmp_path: Path) -> None:
    """A log entry deleted by hand with Hadoop's hidden checksum left beside it (Spark would blame "multiple
    streaming queries"), and a commit with no offsets entry: each refused in one line naming the files."""
    checkpoint = tmp_path / "checkpoint"
    rebuild(Location(checkpoint), {0: {"t": {"0": 5}}, 1: {"t": {"0": 9}}, 2: {"t": {"0": 12}}}, committed_through=2)
    check_readable(checkpoint, "hint")
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").write_bytes(b"crc")
    with pytest.raises(PipelineError, match=r"commits/2 deleted while Hadoop's checksum file\(s\) beside it stayed "
                                            r"\(commits/\.2\.crc\): delete those checksum files too"):  # fmt: skip
        check_readable(checkpoint, "hint")
    (checkpoint / "commits" / ".2.crc").unlink()
    (checkpoint / "offsets" / "2").unlink()
    (checkpoint / "commits" / "2").write_text('v1\n{"nextBatchWatermarkMs":0}')
    with pytest.raises(PipelineError, match=r"commits/2 has no offsets/2 \(the offset log ends at 1\)"):
        check_readable(checkpoint, "hint")


def test_a_sink_that_goes_backwards_while_the_pipeline_runs_stops_it(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    """The Delta sink's trailing commit vanishes between two batches of a running pipeline: the next batch is
    not written; the run stops with one line naming the sink, the next start refuses it, and `checkpoint rewind`
    replays the lost batch and then the one the stopped run had planned: 0/0 by both checkers."""
    generate(kafka_broker.bootstrap_servers, "backwards", 2_000, partitions=2, malformed=0.0, seed=12)
    pipeline_file = write_pipeline(tmp_path, name="backwards", topic="backwards",
                                   bootstrap=kafka_broker.bootstrap_servers, max_offsets=1_000)  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-m", "streamproof", "run", str(pipeline_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 300
        for line in child.stdout:  # the topic drained; then no batch starts until more arrives
            assert time.monotonic() < deadline, "the topic was not drained within 5 minutes"
            if "committed" in line and "kafka lag 0" in line:
                break
        log = tmp_path / "tables" / "orders" / "_delta_log"
        trailing = max(int(path.name.split(".")[0]) for path in log.glob("*.json"))
        for name in (f"{trailing:020d}.json", f".{trailing:020d}.json.crc", f"{trailing:020d}.crc"):
            (log / name).unlink(missing_ok=True)
        generate(kafka_broker.bootstrap_servers, "backwards", 500, partitions=2, malformed=0.0, seed=13)
        _, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
    assert child.returncode == 2, stderr[-2000:]
    # The CLI's own line; Spark's logger may print its ERROR lines about the stopped query before or after it.
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    message = errors[0]
    assert message.startswith("error: pipeline 'backwards' failed: sink delta ("), message
    assert (
        f"sink delta ({tmp_path / 'tables' / 'orders'}) went backwards while the pipeline ran: its latest Delta "
        f"version is {trailing - 1}, it was {trailing} after its last write" in message
    ), message
    assert "stopped before batch" in message and "streamproof checkpoint rewind" in message
    spec = load_pipeline(pipeline_file)
    with pytest.raises(PipelineError, match=r"^sink delta \(.*\) is behind the checkpoint: it holds batches up to"):
        refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    # The stopped run had logged its next batch (the 500 new records) without running it: the rewind replays the
    # lost batch, then that one, each with its logged offsets.
    assert logged_batches(spec.checkpoint_dir)[-1] == committed_batches(spec.checkpoint_dir)[-1] + 1
    rewound = run_cli("checkpoint", "rewind", str(pipeline_file), timeout=600)
    assert rewound.returncode == 0, rewound.stdout[-2000:] + rewound.stderr[-2000:]
    # The planned batch ends where the topic ended when it was planned: the generator may still have been producing
    # (a CI run found 252 of the 500 records past it). A run drains those.
    drained = run_cli("run", str(pipeline_file), "--available-now", timeout=600)
    assert drained.returncode == 0, drained.stderr[-2000:]
    reports = assert_every_sink_clean(spark, pipeline_file, 2_500)
    assert disagreements(reports, verify_independently(spec)) == []
