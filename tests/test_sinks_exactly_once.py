"""Every sink exactly-once through real crashes, in one fan-out pipeline; the weaker guarantees show their damage.

Sinks: Delta MERGE on order_id, PostgreSQL upsert on order_id, PostgreSQL per-customer running totals,
PostgreSQL append, Kafka (transactional, with commit markers) and a Parquet folder (Spark's file sink).

Faults (exactly-once): SIGKILL of the pipeline's process group in the middle of the Delta MERGE's, the Kafka sink's
and the Parquet folder's own write job (PostgreSQL's is killed in test_checkpoint_recovery.py: its modes share the
write path) and after every sink committed (before Spark's commit log); a restart after each; drain. Expected:
every sink 0 lost / 0 duplicated / 0 unexpected, the identity ``source = expected + quarantined + superseded``
exact, and the Kafka output counted by kcat in read_committed mode equal to the records verify found.
Faults (weaker guarantees): at-most-once killed before the write loses and duplicates in none, shown on a PostgreSQL
append and Kafka (its loss comes from the progress it records before any sink writes, the same for every sink:
`prove --matrix` shows it on each). At-least-once's duplicates after the sink commit are shown in CI on a Delta
append (test_proof_matrix.py); on every sink (duplicated in append, totals, Kafka and files, absorbed by the upserts)
by `streamproof prove examples/all_sinks.toml --matrix` (docs/sinks.md), not in the CI budget.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from conftest import run_cli
from streamproof.checkpoint.positions import refuse_if_sink_behind
from streamproof.checkpoint.start import read_sinks, starting_point
from streamproof.config import load_pipeline
from streamproof.errors import PipelineError
from streamproof.faults.points import surviving_processes
from streamproof.generator import generate
from streamproof.harness.crashes import run_with_crashes
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer
from streamproof.kafka_client import ensure_topic
from streamproof.reconcile import Report, verify_pipeline
from streamproof.reconcile.independent import committed_parquet_files, disagreements, verify_independently
from streamproof.reconcile.stored import StoredFolder
from streamproof.sinks import open_sinks
from streamproof.storage.location import Location

pytestmark = [pytest.mark.integration, pytest.mark.crash]

SINK_LABELS = ("merge", "pg-upsert", "pg-totals", "pg-append", "kafka", "files")
JAAS_ENV = "STREAMPROOF_TEST_JAAS"
JAAS_SECRET = "sp-jaas-" + secrets.token_hex(8)
os.environ.setdefault(
    JAAS_ENV, f'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{JAAS_SECRET}";'
)


def fan_out_pipeline(workdir: Path, *, name: str, guarantee: str, topic: str, broker: KafkaBroker,
                     postgres: PostgresServer | None, batch: int,
                     labels: tuple[str, ...] = SINK_LABELS) -> Path:  # fmt: skip
    """A pipeline with one sink of each kind and mode (those in ``labels``; ``postgres`` may be None when none of them
    is PostgreSQL's), its state under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    table = name.replace("-", "_")
    port = postgres.port if postgres is not None else 0
    postgres_sink = f'kind = "postgres"\nport = {port}\npassword = "${{{PG_PASSWORD_ENV}}}"'
    text = f"""
name = "{name}"
guarantee = "{guarantee}"
checkpoint = "{workdir}/checkpoint"

[source]
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "{topic}"
max_offsets_per_trigger = {batch}
# Carried to Spark's Kafka consumer like a real SASL setting (the test broker is PLAINTEXT, so unused).
"kafka.sasl.jaas.config" = "${{{JAAS_ENV}}}"

[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id", "customer_id"]
quarantine = "{workdir}/tables/quarantine"

[[sinks]]
label = "merge"
kind = "delta"
path = "{workdir}/tables/orders"
mode = "merge"
key = "order_id"

[[sinks]]
label = "pg-upsert"
{postgres_sink}
table = "{table}_orders"
mode = "upsert"
key = "order_id"

[[sinks]]
label = "pg-totals"
{postgres_sink}
table = "{table}_totals"
mode = "accumulate"
by = "customer_id"
sum = ["amount"]

[[sinks]]
label = "pg-append"
{postgres_sink}
table = "{table}_events"

[[sinks]]
label = "kafka"
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "{topic}-out"
key = "order_id"

[[sinks]]
label = "files"
kind = "files"
path = "{workdir}/files"
"""
    head, *sinks = text.split("[[sinks]]")
    chosen = [sink for sink in sinks if sink.split('"')[1] in labels]
    pipeline_file = workdir / "pipeline.toml"
    pipeline_file.write_text(head + "".join(f"[[sinks]]{sink}" for sink in chosen))
    return pipeline_file


def _prove(workdir: Path, kafka_broker: KafkaBroker, postgres: PostgresServer, spark: Any, *, guarantee: str,
           points: list[str], events: int, malformed: float,
           labels: tuple[str, ...] = SINK_LABELS) -> tuple[dict[str, Report], Any]:  # fmt: skip
    name = f"fan-{guarantee}"
    generate(kafka_broker.bootstrap_servers, name, events, partitions=4, malformed=malformed, seed=11)
    # Each crash takes one batch of new offsets (the run before replays the batch killed before it, with the same
    # offsets): one batch per crash, the first batch of all, and two to drain (each batch costs ~5 s, whatever its
    # size). The producer's transaction markers take offsets too (~1 in 1,000): the margin keeps them from making a
    # batch of their own at the end.
    batch = events // (len(points) + 3) + events // 500
    pipeline_file = fan_out_pipeline(workdir, name=name, guarantee=guarantee, topic=name, broker=kafka_broker,
                                     postgres=postgres, batch=batch, labels=labels)  # fmt: skip
    harness = run_with_crashes(pipeline_file, points, log_dir=workdir / "logs", emit=print)
    assert surviving_processes(harness.process_groups) == [], "a pipeline process (driver, JVM, worker) survived"
    reports = verify_pipeline(spark, load_pipeline(pipeline_file))
    assert [report.sink for report in reports] == list(labels)
    return {report.sink: report for report in reports}, harness


@pytest.fixture(scope="module")
def exactly_once(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path_factory: Any
) -> tuple[dict[str, Report], Any, Path]:
    workdir = tmp_path_factory.mktemp("fan-out-exactly-once")
    # before-sink-write and after-checkpoint-commit take the same path for every sink (`prove --matrix`
    # proves them, with no write in flight); what differs per sink is its own write being killed, and its
    # replay after a commit.
    # PostgreSQL is not killed in its write here (its three modes share the write path up to the statement that moves
    # the rows): tests/test_checkpoint_recovery.py kills it there, and its replay completes the batch; `prove --matrix`
    # and the slow tier's examples kill each mode.
    points = [*(f"mid-sink-write:{label}" for label in ("merge", "kafka", "files")), "after-sink-commit"]
    reports, harness = _prove(workdir, kafka_broker, streamproof_postgres, spark, guarantee="exactly-once",
                              points=points, events=8_000, malformed=0.01)  # fmt: skip
    return reports, harness, workdir


@pytest.mark.parametrize("label", SINK_LABELS)
def test_every_sink_is_exactly_once_through_every_crash_point(
    exactly_once: tuple[dict[str, Report], Any, Path], label: str
) -> None:
    reports, harness, _ = exactly_once
    assert len(harness.crashes) == 4
    report = reports[label]
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_json()
    assert report.identity_holds and report.source_records == 8_000
    assert report.quarantined > 0
    expected_unit = {"merge": "keys", "pg-upsert": "keys", "pg-totals": "groups"}.get(label, "records")
    assert report.unit == expected_unit
    if expected_unit == "records":
        assert report.sink_records == report.expected == 8_000 - report.quarantined


def test_after_sink_commit_every_sink_held_the_batch_keyed_and_spark_had_not_committed(
    exactly_once: tuple[dict[str, Report], Any, Path],
) -> None:
    _, harness, _ = exactly_once
    (crash,) = [crash for crash in harness.crashes if crash.point == "after-sink-commit"]
    assert crash.facts == {"offsets_logged": True, "checkpoint_committed": False, "sink_has_batch": True,
                           "sink_txn": True, "held_by": list(SINK_LABELS),
                           "write_started": list(SINK_LABELS)}  # fmt: skip
    for crash in harness.crashes:
        if crash.point.startswith("mid-sink-write:"):
            killed = crash.point.split(":")[1]
            # Killed in that sink's write: the sinks before it hold the batch, those after it do not. A sink
            # committing per partition (PostgreSQL, Kafka) is killed in its last partition, which only starts
            # once an earlier one has committed: it holds part of the batch, and its replay must finish it.
            before = list(SINK_LABELS[: SINK_LABELS.index(killed)])
            partial = [killed] if killed.startswith("pg-") or killed == "kafka" else []
            assert crash.facts["checkpoint_committed"] is False, crash.facts
            assert crash.facts["held_by"] == before + partial, crash.facts
            assert crash.facts["write_started"] == [*before, killed], crash.facts  # its write began, no later one
            assert crash.facts.get("partial_in", []) == partial, crash.facts


def _kcat_count(bootstrap_servers: str, topic: str, isolation: str) -> int:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is missing: make setup installs it (Debian package kcat)"
    done = subprocess.run(
        [kcat, "-C", "-b", bootstrap_servers, "-t", topic, "-o", "beginning", "-e", "-q",
         "-X", f"isolation.level={isolation}", "-f", "%o\\n"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return len(done.stdout.split())


def test_kcat_reading_committed_records_agrees_with_verify(
    exactly_once: tuple[dict[str, Report], Any, Path], kafka_broker: KafkaBroker
) -> None:
    reports, _, _ = exactly_once
    committed = _kcat_count(kafka_broker.bootstrap_servers, "fan-exactly-once-out", "read_committed")
    assert committed == reports["kafka"].sink_records == reports["kafka"].expected
    # The Kafka mid-write kill left a flushed, never-committed transaction: visible to a reader that does not
    # honour transactions, invisible to read_committed. Without it this check would prove nothing.
    assert _kcat_count(kafka_broker.bootstrap_servers, "fan-exactly-once-out", "read_uncommitted") > committed


def test_no_log_line_holds_a_secret(exactly_once: tuple[dict[str, Report], Any, Path]) -> None:
    """The database password and the Kafka SASL secret were in use through five runs and four crashes."""
    _, _, workdir = exactly_once
    logs = [*(workdir / "logs").glob("*.log"), *(workdir / "logs").glob("*.out")]
    assert len(logs) == 2 * 5
    for secret in (os.environ[PG_PASSWORD_ENV], JAAS_SECRET):
        leaking = [log.name for log in logs if secret in log.read_text(errors="replace")]
        assert leaking == []


def test_at_most_once_loses_and_never_duplicates(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path
) -> None:
    reports, _ = _prove(tmp_path, kafka_broker, streamproof_postgres, spark, guarantee="at-most-once",
                        points=["before-sink-write"], events=4_000, malformed=0.0,
                        labels=("pg-append", "kafka"))  # fmt: skip
    for report in reports.values():
        assert report.lost > 0 and (report.duplicated, report.unexpected) == (0, 0), report.to_json()


def test_vacuum_removes_the_files_a_killed_merge_left_and_the_table_reads_the_same(
    exactly_once: tuple[dict[str, Report], Any, Path], spark: Any
) -> None:
    """Fault: the SIGKILL in the middle of the Delta MERGE's write. Its data files stay on disk, referenced by no
    commit; VACUUM with a zero retention deletes exactly those, then OPTIMIZE, and the table's rows are the same before
    and after (the next test's checkers, both, read the table after it)."""
    from streamproof.maintenance import optimize, unreferenced_files, vacuum

    _, harness, workdir = exactly_once
    assert any(crash.point == "mid-sink-write:merge" for crash in harness.crashes)
    spec = load_pipeline(workdir / "pipeline.toml")
    table = workdir / "tables" / "orders"
    rows = sorted(spark.read.format("delta").load(str(table)).collect())
    orphans = unreferenced_files(spark, table)
    assert orphans, "the killed MERGE left no data file behind: the crash did not land mid-write"

    result = vacuum(spark, spec, table, retention_hours=0, allow_short_retention=True)
    assert result.deleted_files == len(orphans)
    assert unreferenced_files(spark, table) == [] and not any(path.exists() for path in orphans)
    compacted = optimize(spark, table)  # a MERGE rewrites the files it updates: there may be nothing to compact
    assert compacted.files_removed >= compacted.files_added
    assert sorted(spark.read.format("delta").load(str(table)).collect()) == rows


def test_both_checkers_agree_after_the_kills_and_both_catch_a_planted_defect_in_every_sink_kind(
    exactly_once: tuple[dict[str, Report], Any, Path], kafka_broker: KafkaBroker, spark: Any
) -> None:
    """The independent checker (no Spark: confluent-kafka, delta-rs, psycopg, pyarrow, its own JSON parsing) agrees
    with verify term by term on the SIGKILLed fan-out; then one defect is planted in each kind of sink, with tools
    that are not the pipeline's, and both report exactly it. (Last in this module: it damages the sinks.)"""
    import psycopg
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka import Consumer, Producer, TopicPartition
    from deltalake import DeltaTable

    reports, _, workdir = exactly_once
    spec = load_pipeline(workdir / "pipeline.toml")
    independent = verify_independently(spec)
    assert disagreements(list(reports.values()), independent) == []
    assert all(report.verdict == "ok" for report in independent), [r.to_json() for r in independent]

    # Delta (MERGE sink): one key's row deleted with delta-rs.
    merge = DeltaTable(str(workdir / "tables" / "orders"))
    victim = merge.to_pyarrow_table(columns=["order_id"]).column("order_id")[0].as_py()
    merge.delete(f"order_id = '{victim}'")
    # PostgreSQL (append sink): one row inserted a second time.
    (pg_append,) = [sink for sink in spec.sink_specs if sink.name == "pg-append"]
    with psycopg.connect(pg_append.conninfo()) as connection:
        connection.execute(f'INSERT INTO "{pg_append.table}" SELECT * FROM "{pg_append.table}" LIMIT 1')
    # Kafka: one committed record of the output produced again by a plain producer.
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "plant",
                         "isolation.level": "read_committed"})  # fmt: skip
    consumer.assign([TopicPartition("fan-exactly-once-out", 0, 0)])
    message = consumer.consume(1, timeout=30)[0]
    consumer.close()
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    producer.produce("fan-exactly-once-out", value=message.value(), key=message.key(), partition=0)
    assert producer.flush(30) == 0
    # Parquet (Spark's file sink): one row written again as a new file, entered in the sink's own log.
    files = workdir / "files"
    first = committed_parquet_files(StoredFolder.at(Location(files), "files"))[0]
    copy = files / "part-planted-duplicate.parquet"
    pq.write_table(pa.Table.from_batches([pq.read_table(first).to_batches()[0].slice(0, 1)]), copy)
    log = sorted((files / "_spark_metadata").glob("[0-9]*"), key=lambda p: int(p.name.split(".")[0]))[-1]
    entry = {"path": copy.as_uri(), "size": copy.stat().st_size, "isDir": False, "modificationTime": 0,
             "blockReplication": 1, "blockSize": 33554432, "action": "add"}  # fmt: skip
    log.write_text(log.read_text().rstrip("\n") + "\n" + json.dumps(entry, separators=(",", ":")))

    with_spark = verify_pipeline(spark, spec)
    without = verify_independently(spec)
    assert disagreements(with_spark, without) == []
    damage = {report.sink: (report.lost, report.duplicated, report.unexpected) for report in without}
    assert damage == {"merge": (1, 0, 0), "pg-upsert": (0, 0, 0), "pg-totals": (0, 0, 0), "pg-append": (0, 1, 0),
                      "kafka": (0, 1, 0), "files": (0, 1, 0)}, damage  # fmt: skip
    assert without[0].samples["lost"] == [{"order_id": victim, "found": "no row with its latest record"}]
    assert [report.verdict for report in with_spark] == ["damaged", "ok", "ok", "damaged", "damaged", "damaged"]


def test_a_batch_of_null_amounts_adds_0_and_never_poisons_a_running_total(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path
) -> None:
    """The reported run: four records into a one-partition topic, batches of two (one short run, no fault); c1's
    amounts null then 3.0, c2's 5.0 then 1.0. Batch 0 holds c1's one null amount: ``sum()`` of it was NULL, and
    ``NULL + 3.0`` in batch 1 stayed NULL, which verify passed as ok and verify --independent called a duplicate.
    Expected: the table holds c1 3.0 and c2 6.0 with 2 events each, and both checkers say ok, term by term alike."""
    import psycopg
    from confluent_kafka import Producer

    name = "null-totals"
    ensure_topic(kafka_broker.bootstrap_servers, name, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "enable.idempotence": True})
    for offset, (customer, amount) in enumerate([("c1", None), ("c2", 5.0), ("c1", 3.0), ("c2", 1.0)]):
        record = {"event_id": f"e{offset}", "order_id": f"o{offset}", "customer_id": customer, "amount": amount,
                  "status": "paid", "event_time": f"2026-01-01T00:00:0{offset}.000Z"}  # fmt: skip
        producer.produce(name, value=json.dumps(record).encode(), partition=0)
    assert producer.flush(30) == 0
    pipeline_file = fan_out_pipeline(tmp_path, name=name, guarantee="exactly-once", topic=name, broker=kafka_broker,
                                     postgres=streamproof_postgres, batch=2, labels=("pg-totals",))  # fmt: skip
    done = run_cli("run", str(pipeline_file), "--available-now", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    spec = load_pipeline(pipeline_file)
    (sink,) = spec.sink_specs
    with psycopg.connect(sink.conninfo()) as connection:
        batches = connection.execute(
            f'SELECT batch_id, rows FROM "{sink.db_schema}"."{sink.ledger_table}" WHERE pipeline = %s AND '
            "source_key <> '*' ORDER BY batch_id", (name,),
        ).fetchall()  # fmt: skip
        held = connection.execute(
            f'SELECT customer_id, amount, events FROM "{sink.db_schema}"."{sink.table}" ORDER BY customer_id'
        ).fetchall()
    assert batches == [(0, 2), (1, 2)]  # c1's null alone in batch 0, its 3.0 in batch 1
    assert held == [("c1", Decimal("3"), 2), ("c2", Decimal("6"), 2)]
    with_spark, independent = verify_pipeline(spark, spec), verify_independently(spec)
    assert disagreements(with_spark, independent) == []
    for report in (*with_spark, *independent):
        figures = (report.verdict, report.source_records, report.expected, report.superseded, report.duplicated,
                   report.wrong_values, report.samples)  # fmt: skip
        assert figures == ("ok", 4, 2, 2, 0, 0, {}), report.to_json()


def test_a_kafka_sink_topic_recreated_under_its_markers_is_refused(
    exactly_once: tuple[dict[str, Report], Any, Path], kafka_broker: KafkaBroker
) -> None:
    """The module's last test (after the planted defects): the output topic deleted and created again, empty,
    while its marker topic still says every batch is written. A replay would skip them by those markers: the start
    is refused, naming what is gone."""
    _, _, workdir = exactly_once
    spec = load_pipeline(workdir / "pipeline.toml")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for future in admin.delete_topics(["fan-exactly-once-out"]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 60
    while "fan-exactly-once-out" in admin.list_topics(timeout=10).topics:  # the broker deletes after answering
        assert time.monotonic() < deadline, "the topic was not deleted within 60 s"
        time.sleep(0.5)
    ensure_topic(kafka_broker.bootstrap_servers, "fan-exactly-once-out", 4)
    with pytest.raises(PipelineError) as refusal:  # as `run` refuses it before Spark starts
        refuse_if_sink_behind(spec, read_sinks(None, open_sinks(spec), starting_point(spec)))
    message = str(refusal.value)
    assert message.startswith("sink kafka (kafka://") and "holds fewer records than its commit markers say (" in (
        message), message  # fmt: skip
    assert "partition 0 ends at offset 0, batch " in message and "fan-exactly-once-out.streamproof-markers" in message
