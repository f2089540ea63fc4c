"""Set-up step (``make setup``): the class-data archive of a trained Spark JVM.

One short session runs through the code paths a pipeline uses (parse, quarantine, keyed Delta appends and a
MERGE, Spark's file sink, the Kafka connector's classes, a streaming query with ``foreachBatch``), and the JVM
writes the classes it loaded to :func:`streamproof.jvm.session.startup_archive` when it exits: every later JVM start
is ~4 s faster. Idempotent: an existing archive is kept.

An archive holds for one pyspark install (its key holds the install's path), so each clone makes its own, 200 MB
each. Beside each archive a ``.pyspark`` file names the install it was made for, and every call removes the archives
whose install is gone (:func:`prune_archives`), those made before that file existed, and this install's own older
ones (another jar set or JDK), but never the one it keeps.

Example::

    $ python -m streamproof.jvm.archive
    JVM start-up archive: /root/.cache/streamproof/jvm/spark-578d67b679e97af4.jsa
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pyspark
from pyspark.sql import DataFrame, SparkSession

from streamproof.config import Transform, parse_pipeline
from streamproof.errors import SetupError
from streamproof.jvm.session import build_session, startup_archive
from streamproof.sinks import open_sinks
from streamproof.sinks.base import Batch
from streamproof.transform.records import parse_records, quarantined_records, valid_records


def prepare_startup_archive() -> Path:
    """Set-up step: run one short session through the code paths a pipeline uses, and let the JVM write the
    classes it loaded to :func:`startup_archive` when it exits. Idempotent: an existing archive is kept.
    """
    archive = startup_archive()
    prune_archives(archive)
    if archive.exists():
        if not _owner(archive).exists():  # made before owners were named: named now, so that it is kept
            _owner(archive).write_text(pyspark.__file__)
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    spark = build_session(app_name="streamproof-setup", archive_classes_to=partial)
    with tempfile.TemporaryDirectory() as scratch:
        _exercise_pipeline_code_paths(spark, Path(scratch))
    gateway = spark.sparkContext._gateway
    assert gateway is not None, "a classic session has a JVM gateway"
    gateway_process = gateway.proc
    spark.stop()
    # The JVM writes the archive as it exits: close its stdin (PySpark's exit signal) and wait for it.
    gateway_process.stdin.close()
    gateway_process.wait(timeout=600)
    if not partial.exists():
        raise SetupError(f"the JVM did not write its class-data archive to {partial}")
    _owner(archive).write_text(pyspark.__file__)
    partial.rename(archive)
    return archive


def prune_archives(keep: Path) -> list[Path]:
    """Remove the archives beside ``keep`` whose pyspark install is gone, that name none, or that are this install's
    own but not ``keep`` (made for an earlier jar set or JDK: each change to streamproof's Java classes makes a new
    one, 194 MB, and 15 of them once left the disk too full for the test suite); return them. Another clone's archive
    stays while its install exists.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> other_install = folder / "other-clone-pyspark-init.py"
    >>> _ = other_install.write_text("")
    >>> for name, owner in (("spark-a.jsa", str(other_install)), ("spark-b.jsa", "/gone/pyspark/__init__.py"),
    ...                     ("spark-c.jsa", None), ("spark-d.jsa", None), ("spark-e.jsa", pyspark.__file__)):
    ...     _ = (folder / name).write_bytes(b"archive")
    ...     _ = owner and _owner(folder / name).write_text(owner)
    >>> sorted(path.name for path in prune_archives(keep=folder / "spark-d.jsa"))
    ['spark-b.jsa', 'spark-c.jsa', 'spark-e.jsa']
    >>> sorted(path.name for path in folder.glob("spark-*"))
    ['spark-a.jsa', 'spark-a.pyspark', 'spark-d.jsa']
    """
    removed = []
    this_install = Path(pyspark.__file__)
    for archive in sorted(keep.parent.glob("spark-*.jsa")):
        owner = _owner(archive)
        install = Path(owner.read_text().strip()) if owner.exists() else None
        if archive == keep or (install is not None and install.exists() and install != this_install):
            continue
        archive.unlink(missing_ok=True)  # a JVM that has it mapped keeps reading it: Linux frees it after
        owner.unlink(missing_ok=True)
        removed.append(archive)
    return removed


def _owner(archive: Path) -> Path:
    return archive.with_suffix(".pyspark")


def _exercise_pipeline_code_paths(spark: SparkSession, scratch: Path) -> None:
    transform = Transform.model_validate(
        {"schema": "event_id STRING, amount DOUBLE, event_time TIMESTAMP", "required": ["event_id"]}
    )
    records = [
        (b'{"event_id":"e1","amount":1.5,"event_time":"2026-01-01T00:00:00Z"}', "t", 0, 0),
        (b'{"event_id":"e2","amount":"x"}', "t", 0, 1),
        (b"\xff", "t", 0, 2),
    ]
    raw = spark.createDataFrame(records, "value BINARY, topic STRING, partition INT, offset LONG").selectExpr(
        "value", "topic", "partition", "offset", "current_timestamp() AS timestamp"
    )
    parsed = parse_records(raw, transform).cache()
    for batch_id, table in enumerate(("sink", "quarantine")):
        frame = valid_records(parsed) if table == "sink" else quarantined_records(parsed)
        (
            frame.write.format("delta")
            .mode("append")
            .option("txnAppId", "streamproof/setup")
            .option("txnVersion", batch_id)
            .option("userMetadata", "{}")
            .save(str(scratch / table))
        )
    spark.read.format("delta").load(str(scratch / "sink")).count()
    _exercise_sinks(spark, valid_records(parsed), scratch)
    # The Kafka connector's classes, without a broker: resolving the relation's schema connects to nothing.
    kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1").option("subscribe", "x")
    assert "offset" in kafka.load().schema.fieldNames()
    # A streaming query with foreachBatch, as a pipeline runs one.
    (scratch / "in").mkdir()
    (scratch / "in" / "1.txt").write_text('{"event_id":"e3","amount":2.0}\n')
    stream = (
        spark.readStream.format("text")
        .load(str(scratch / "in"))
        .selectExpr(
            "CAST(value AS BINARY) AS value",
            "'t' AS topic",
            "0 AS partition",
            "0L AS offset",
            "current_timestamp() AS timestamp",
        )
    )
    query = (
        parse_records(stream, transform)
        .writeStream.option("checkpointLocation", str(scratch / "checkpoint"))
        .foreachBatch(
            lambda batch, batch_id: (
                valid_records(batch)
                .write.format("delta")
                .mode("append")
                .option("txnAppId", "streamproof/setup-stream")
                .option("txnVersion", batch_id)
                .save(str(scratch / "stream-sink"))
            )
        )
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)


def _exercise_sinks(spark: SparkSession, rows: DataFrame, scratch: Path) -> None:
    """Delta MERGE and Spark's file sink, through the sinks' own code (their classes are many, and cold)."""

    spec = parse_pipeline(f"""
name = "setup"
[source]
kind = "kafka"
topic = "setup"
[transform]
schema = "event_id STRING, amount DOUBLE, event_time TIMESTAMP"
required = ["event_id"]
[[sinks]]
kind = "delta"
path = "{scratch / "merge"}"
mode = "merge"
key = "event_id"
[[sinks]]
kind = "files"
path = "{scratch / "files"}"
""")
    for sink in open_sinks(spec):
        for batch_id in (0, 1):
            sink.write(rows, Batch("setup", batch_id, {"setup": {"0": batch_id}}, keyed=True, rows=1))


if __name__ == "__main__":
    try:
        print(f"JVM start-up archive: {prepare_startup_archive()}")
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
