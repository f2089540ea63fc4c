"""The SparkSession a pipeline runs in: cached jars, Delta extensions, defaults sized for a laptop.

Nothing here downloads anything: the jars come from the cache that ``make setup`` filled
(:mod:`streamproof.jars`). On a cluster, ``[spark] master`` and ``[spark.conf]`` override the defaults.

Example::

    >>> from streamproof.session import build_session
    >>> spark = build_session()                       # local[2], Delta + Kafka connector loaded
    >>> spark.range(3).write.format("delta").save("/tmp/t")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from streamproof.config import SparkSettings
from streamproof.errors import ConfigError, SetupError
from streamproof.jars import cached_jars

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"


@functools.cache
def check_java() -> str:
    """Return the Java major version; raise :class:`SetupError` if java is missing or older than 17."""
    java = shutil.which("java", path=_java_path())
    if java is None:
        raise SetupError("`java` is not on PATH: install Java 17 (apt-get install -y openjdk-17-jdk-headless)")
    banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0_..."
        major = int(match.group(2))
    if major < 17:
        raise SetupError(f"Java 17 or newer is needed, found {banner.splitlines()[0] if banner else java}")
    return str(major)


def _java_path() -> str:
    java_home = os.environ.get("JAVA_HOME")
    path = os.environ.get("PATH", "")
    return f"{java_home}/bin{os.pathsep}{path}" if java_home else path


def startup_archive() -> Path:
    """Where the JVM class-data archive for this JDK, pyspark install and jar set lives (may not exist).

    The archive holds the classes a streamproof session loads, pre-parsed: a JVM started with it reaches
    a running SparkSession about 4 s sooner (measured 9.5 s -> 5.8 s on 2 cores), which every restart
    after a crash pays. It is only valid for the exact JDK and classpath it was made with, hence the key.
    """
    import pyspark

    from streamproof.jars import cache_root, jar_set

    java_banner = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    key = hashlib.sha256(
        "\n".join([java_banner, pyspark.__file__, pyspark.__version__, jar_set("spark").key()]).encode()
    ).hexdigest()[:16]
    return cache_root() / "jvm" / f"spark-{key}.jsa"


# A stale or foreign archive is ignored by the JVM; these keep it from saying so on stdout.
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
JIT_ENV = "STREAMPROOF_JIT"
# C1 only. Measured on 2 cores, two 50k-event runs side by side: 60 s with tiered compilation, 35 s with
# this (C2's compiler threads compete with the tasks); alone at 500k events, steady batches ~15% slower.
_QUICK_START_JIT = "-XX:TieredStopAtLevel=1"


def jit_option(settings: SparkSettings) -> str:
    """The JVM flag of ``[spark] jit`` (or of ``$STREAMPROOF_JIT``, which wins): C1 only for quick-start."""
    jit = os.environ.get(JIT_ENV) or settings.jit
    if jit not in ("tiered", "quick-start"):
        raise ConfigError(f"${JIT_ENV}={jit!r}: expected tiered or quick-start")
    return _QUICK_START_JIT if jit == "quick-start" else ""


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def session_conf(settings: SparkSettings, *, archive_classes_to: Path | None = None) -> dict[str, str]:
    """Spark configuration streamproof starts every session with (user ``[spark.conf]`` wins)."""
    conf = {
        "spark.master": settings.master,
        "spark.driver.memory": settings.driver_memory,
        "spark.jars": ",".join(str(jar) for jar in cached_jars("spark")),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.default.parallelism": str(settings.shuffle_partitions),
        # Delta reconstructs table state with 50 tasks by default: pure overhead on a laptop.
        "spark.databricks.delta.snapshotPartitions": str(settings.shuffle_partitions),
        # VACUUM lists the table's folders in a job of this many tasks (default 10,000): measured on a 50k-row
        # table, a VACUUM DRY RUN took 47 s warm with the default and 3.3 s with 2.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(settings.shuffle_partitions),
        # Event times are compared and stored in UTC whatever the machine's zone.
        "spark.sql.session.timeZone": "UTC",
        # No extra batch without data just to move the watermark on: the dedup state is evicted by the next batch
        # with data anyway, and every batch then holds records (one batch line, one keyed sink commit each).
        # Window pipelines turn it back on (pipeline.start_query): closed windows must not wait for new data.
        NO_DATA_BATCHES: "false",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": " ".join(
            option
            for option in (
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
                _class_data_option(archive_classes_to),
                _QUIET_CDS,
                jit_option(settings),
                "-XX:+UseParallelGC" if settings.gc == "parallel" else "-XX:+UseG1GC",
            )
            if option
        ),
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.sql.debug.maxToStringFields": "200",
        # A micro-batch is cached once to feed two writes (sink and quarantine) and dropped right after:
        # compressing it costs more than it saves (measured: 25% of the batch's materialisation time).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    conf.update(settings.conf)
    return conf


def _class_data_option(archive_classes_to: Path | None) -> str:
    if archive_classes_to is not None:
        return f"-XX:ArchiveClassesAtExit={archive_classes_to}"
    archive = startup_archive()
    return f"-XX:SharedArchiveFile={archive}" if archive.exists() else ""


def build_session(
    settings: SparkSettings | None = None, app_name: str = "streamproof", *, archive_classes_to: Path | None = None
) -> SparkSession:
    """Start (or reuse) the process's SparkSession with streamproof's defaults."""
    check_java()
    settings = settings or SparkSettings()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(settings, archive_classes_to=archive_classes_to).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def prepare_startup_archive() -> Path:
    """Set-up step: run one short session through the code paths a pipeline uses, and let the JVM write the
    classes it loaded to :func:`startup_archive` when it exits. Idempotent: an existing archive is kept.
    """
    import tempfile

    archive = startup_archive()
    if archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    spark = build_session(app_name="streamproof-setup", archive_classes_to=partial)
    with tempfile.TemporaryDirectory() as scratch:
        _exercise_pipeline_code_paths(spark, Path(scratch))
    gateway_process = spark.sparkContext._gateway.proc  # type: ignore[attr-defined]
    spark.stop()
    # The JVM writes the archive as it exits: close its stdin (PySpark's exit signal) and wait for it.
    gateway_process.stdin.close()
    gateway_process.wait(timeout=600)
    if not partial.exists():
        raise SetupError(f"the JVM did not write its class-data archive to {partial}")
    partial.rename(archive)
    return archive


def _exercise_pipeline_code_paths(spark: SparkSession, scratch: Path) -> None:
    from streamproof.config import Transform
    from streamproof.transform import parse_records, quarantined_records, valid_records

    transform = Transform.model_validate({"schema": "event_id STRING, amount DOUBLE, event_time TIMESTAMP",
                                          "required": ["event_id"]})  # fmt: skip
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
        (frame.write.format("delta").mode("append").option("txnAppId", "streamproof/setup")
         .option("txnVersion", batch_id).option("userMetadata", "{}").save(str(scratch / table)))  # fmt: skip
    spark.read.format("delta").load(str(scratch / "sink")).count()
    _exercise_sinks(spark, valid_records(parsed), scratch)
    # The Kafka connector's classes, without a broker: resolving the relation's schema connects to nothing.
    kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:1").option("subscribe", "x")
    assert "offset" in kafka.load().schema.fieldNames()
    # A streaming query with foreachBatch, as a pipeline runs one.
    (scratch / "in").mkdir()
    (scratch / "in" / "1.txt").write_text('{"event_id":"e3","amount":2.0}\n')
    stream = spark.readStream.format("text").load(str(scratch / "in")).selectExpr(
        "CAST(value AS BINARY) AS value", "'t' AS topic", "0 AS partition", "0L AS offset",
        "current_timestamp() AS timestamp",
    )  # fmt: skip
    query = (
        parse_records(stream, transform).writeStream.option("checkpointLocation", str(scratch / "checkpoint"))
        .foreachBatch(lambda batch, batch_id: valid_records(batch).write.format("delta").mode("append")
                      .option("txnAppId", "streamproof/setup-stream").option("txnVersion", batch_id)
                      .save(str(scratch / "stream-sink")))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(300)


def _exercise_sinks(spark: SparkSession, rows: DataFrame, scratch: Path) -> None:
    """Delta MERGE and Spark's file sink, through the sinks' own code (their classes are many, and cold)."""
    from streamproof.config import parse_pipeline
    from streamproof.sinks.base import Batch, open_sinks

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
