"""The SparkSession a pipeline runs in: cached jars, Delta extensions, defaults sized for a laptop.

Nothing here downloads anything: the jars come from the cache that ``make setup`` filled
(:mod:`streamproof.jvm.jars`). On a cluster, ``[spark] master`` and ``[spark.conf]`` override the defaults.

Example::

    >>> from streamproof.jvm.session import build_session
    >>> spark = build_session()                       # local[2], Delta + Kafka connector loaded
    >>> spark.range(3).write.format("delta").save("/tmp/t")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from streamproof.config import COORDINATES, PipelineSpec, SparkSettings
from streamproof.errors import ConfigError
from streamproof.guarantees import hadoop_refusal
from streamproof.jvm.jars import cache_root, cached_jars, check_java, driver_classpath, jar_set

LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
# The file Spark's driver log goes to whole (log4j2.properties): set by a pipeline run before its JVM starts.
SPARK_LOG_ENV = "STREAMPROOF_SPARK_LOG"


def startup_archive() -> Path:
    """Where the JVM class-data archive for this JDK, pyspark install and jar set lives (may not exist).

    The archive holds the classes a streamproof session loads, pre-parsed: a JVM started with it reaches
    a running SparkSession about 4 s sooner (measured 9.5 s -> 5.8 s on 2 cores), which every restart
    after a crash pays. It is only valid for the exact JDK and classpath it was made with, hence the key.
    """
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
# Tiered, each method compiled after 3 times as many calls and loops as the JVM's default: on 2 cores C2 took 27-28%
# of the machine through a 25 s drain while the tasks waited for a core (why compiling later helps was not looked
# into). Alternated fresh drains of the bench topic, 6 pairs (docs/performance.md, 2026-11-29): steady batches faster
# in all 6 (+3% to +17%), the first batch shorter in 5; 2 was about as good, 5 worse, 0.25 (sooner) worse still.
# Spark's own sink gains nothing from it. A long run's steady state is the same: its hot code gets compiled.
_TIERED_JIT = "-XX:CompileThresholdScaling=3"


# Class metadata (Metaspace) grows to about 52 MB in a drain; the JVM's default first threshold is 21 MB, and each
# time the metadata outgrows the threshold ParallelGC collects the whole heap ("Metadata GC Threshold" in -Xlog:gc):
# 5 full collections in a fresh drain of the bench topic, 4 in the start and one in the first batch (135 ms). With
# the first threshold at 256 MB none happens. Alternated fresh drains of the bench topic, 6 pairs (docs/performance.md,
# 2026-11-30): the first batch shorter in all 6 (medians 10.34 -> 9.80 s), its commit 0.6 s sooner from the launch.
# Nothing is reserved by it: it is only where the first metadata-triggered collection happens.
_CLASS_METADATA_THRESHOLD = "-XX:MetaspaceSize=256m"


# The driver's heap starts at its maximum (``[spark] driver_memory``): grown from the JVM's default start (1/64 of
# the machine's memory), the heap was collected in full as it grew (3 full collections in a run's first 8 s,
# 0.09-0.21 s each on 2 cores). Alternated fresh drains of the bench topic, 4 pairs (docs/performance.md,
# 2026-11-29): the first batch 0.28-0.52 s shorter, whole runs 0.9-3.4% faster; Spark's own sink, which caches
# nothing, gains nothing from it.
_MEMORY = re.compile(r"(\d+)\s*(b|k|kb|m|mb|g|gb|t|tb)?", re.IGNORECASE)
_MIB = {"b": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}


def initial_heap_option(driver_memory: str) -> str:
    """The JVM flag that starts the driver's heap at ``driver_memory`` (Spark's notation, MiB without a unit),
    or nothing for a size Spark itself will refuse.

    >>> initial_heap_option("2g"), initial_heap_option("1536"), initial_heap_option("4GB"), initial_heap_option("x")
    ('-Xms2048m', '-Xms1536m', '-Xms4096m', '')
    """
    found = _MEMORY.fullmatch(driver_memory.strip())
    if found is None:
        return ""
    mib = int(found.group(1)) * _MIB[(found.group(2) or "m")[0].lower()]
    return f"-Xms{int(mib)}m" if mib >= 1 else ""


def jit_option(settings: SparkSettings) -> str:
    """The JVM flag of ``[spark] jit`` (or of ``$STREAMPROOF_JIT``, which wins): C1 only for quick-start, later
    compilation for tiered.

    >>> jit_option(SparkSettings(jit="tiered"))  # without $STREAMPROOF_JIT           # doctest: +SKIP
    '-XX:CompileThresholdScaling=3'
    """
    jit = os.environ.get(JIT_ENV) or settings.jit
    if jit not in ("tiered", "quick-start"):
        raise ConfigError(f"${JIT_ENV}={jit!r}: expected tiered or quick-start")
    return _QUICK_START_JIT if jit == "quick-start" else _TIERED_JIT


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
LOCAL_FILE_SYSTEM = "dev.streamproof.fs.ForklessLocalFileSystem"
LOCAL_FILE_CONTEXT = "dev.streamproof.fs.ForklessLocalFs"


UI_ENV = "STREAMPROOF_SPARK_UI"  # "off": no web UI whatever [spark] ui says


def ui_wanted(settings: SparkSettings) -> bool:
    """Whether a pipeline run serves Spark's web UI: ``[spark] ui``, unless ``$STREAMPROOF_SPARK_UI=off``.

    >>> ui_wanted(SparkSettings(ui=False))
    False
    """
    return settings.ui and os.environ.get(UI_ENV, "").lower() != "off"


def session_conf(
    settings: SparkSettings, *, archive_classes_to: Path | None = None, ui: bool = False
) -> dict[str, str]:
    """Spark configuration streamproof starts every session with (user ``[spark.conf]`` wins); ``ui``: serve
    Spark's web UI on ``[spark] ui_port`` (only a pipeline run does: the other commands live seconds).

    >>> delay = "spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms"
    >>> session_conf(SparkSettings())[delay], session_conf(SparkSettings(conf={delay: "400"}))[delay]
    ('10', '400')
    """
    conf = {
        "spark.master": settings.master,
        "spark.driver.memory": settings.driver_memory,
        "spark.jars": ",".join(str(jar) for jar in cached_jars("spark")),
        "spark.driver.extraClassPath": os.pathsep.join(str(jar) for jar in driver_classpath()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.default.parallelism": str(settings.shuffle_partitions),
        # New Delta tables write a checkpoint every 100 commits, not Delta's 10: the checkpoint is written on the
        # batch's path, and every tenth batch of each table paid it. `bench latency` at 20,000 events/s, alternated
        # runs: p99 after warm-up 5.63 / 6.42 s with 10, 1.95 / 1.76 s with 100; over all rows 6.89 / 6.26 s
        # against 4.90 / 4.60 s. Loading a 99-commit table cold: median 0.368 s with 10, 0.356 s with 100.
        "spark.databricks.delta.properties.defaults.checkpointInterval": "100",
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
        "spark.ui.enabled": "true" if ui else "false",
        **({"spark.ui.port": str(settings.ui_port)} if ui else {}),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": " ".join(
            option
            for option in (
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
                f"-Dstreamproof.spark.log={os.environ[SPARK_LOG_ENV]}" if os.environ.get(SPARK_LOG_ENV) else None,
                _class_data_option(archive_classes_to),
                _QUIET_CDS,
                jit_option(settings),
                initial_heap_option(settings.driver_memory),
                _CLASS_METADATA_THRESHOLD,
                "-XX:+UseParallelGC" if settings.gc == "parallel" else "-XX:+UseG1GC",
            )
            if option
        ),
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.sql.debug.maxToStringFields": "200",
        # A micro-batch is cached once to feed two writes (sink and quarantine) and dropped right after:
        # compressing it costs more than it saves (measured: 25% of the batch's materialisation time).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Delta lists a young table's files (under 50) in each commit's checksum file, built from the previous
        # checksum's list; a new table has none, so its first commit builds the empty table's list through a Spark job,
        # on a cold JVM. A first batch creating the sink and quarantine tables, 12 alternated pairs of fresh drains:
        # 10.55 s with the list, 9.76 s without it (medians; shorter in 11 pairs); the steady batches 140,227 against
        # 137,982 rows/s, inside the rounds' spread (docs/performance.md). A reader of a small table rebuilds the list
        # from the log instead, as it does for every table of 50 files or more.
        "spark.databricks.delta.allFilesInCrc.enabled": "false",
        # Timestamps as Parquet's INT64 microseconds (Spark's and Delta's type, and what Delta's Iceberg compatibility
        # writes), not the deprecated INT96: Parquet builds an INT96 column's dictionary over 12-byte arrays, a hash map
        # of objects, and that was a fifth of a warm write task's samples (Flight Recorder). 3 alternated rounds of
        # fresh drains (docs/performance.md, 2026-11-30): steady 178,912 -> 197,135 rows/s, first batch 7.67 -> 7.43 s,
        # the sink's files 8% smaller; Spark's own sink 109,330 -> 116,234 rows/s. Spark reads a table holding both
        # (tests/test_session_jars.py::test_timestamps_are_int64_microseconds_and_a_table_written_both_ways_reads_back).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # A record's offset is unique in its file: a dictionary of it is built only to be dropped for plain values.
        f"spark.hadoop.parquet.enable.dictionary#{COORDINATES[2]}": "false",
        # Files on the local disk without a process each: with no native library (pyspark ships none), Hadoop runs
        # `chmod` for every file it creates and `readlink` twice for every rename Spark's checkpoint logs and Delta's
        # log store make (dev.streamproof.fs.ForklessRawLocalFileSystem says what it does instead, and measured).
        "spark.hadoop.fs.file.impl": LOCAL_FILE_SYSTEM,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": LOCAL_FILE_CONTEXT,
        **HDFS_CLOSE_RETRY,
    }
    if not settings.master.startswith("local"):
        conf.update(CLUSTER_DEFAULTS)
        if jit_option(settings):  # an executor of a short run compiles with C2 as much as a driver does
            conf["spark.executor.extraJavaOptions"] = jit_option(settings)
        if settings.on_this_machine:  # executors reach the driver on the loopback it binds (SPARK_LOCAL_IP)
            conf["spark.driver.host"] = "127.0.0.1"
    ours = conf["spark.driver.extraClassPath"]
    conf.update(settings.conf)
    yours = conf["spark.driver.extraClassPath"]
    if yours != ours:  # yours added to ours: the local file system's class stays on it
        conf["spark.driver.extraClassPath"] = os.pathsep.join(path for path in (ours, yours) if path)
    return conf


# An HDFS client that closes a file before the DataNode has reported its block asks the NameNode again after a delay:
# Hadoop's default is 400 ms, doubling, 5 retries (it gives up after 12.4 s). Each small file a batch writes on HDFS
# (Spark's offsets and commits, a Delta commit, its checksum) waits it when the report comes after the close. With
# 10 ms and 10 retries (it gives up after 10.2 s): 74.9 small files/s against 4.2 and 3.2 on the HDFS of `infra up
# --hdfs` (benchmarks/profile_hdfs_small_files.py); the bench pipeline on that HDFS, steady batch 0.678, 0.835 and
# 0.482 of Hadoop's default's in three runs, first batch 0.923, 0.972 and 0.948 (benchmarks/profile_hdfs_pipeline.py).
HDFS_CLOSE_RETRY = {
    "spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "10",
    "spark.hadoop.dfs.client.block.write.locateFollowingBlock.retries": "10",
}
HADOOP_CLOSE_RETRY = {  # what it replaces (hdfs-default.xml), for the benchmarks that compare the two
    "spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "400",
    "spark.hadoop.dfs.client.block.write.locateFollowingBlock.retries": "5",
}

# On a cluster: one core per executor (a task a core, as on a 2-core laptop), executors small enough for two of them
# next to a driver on 2 cores (the test cluster's workers offer 1 core and 1g each); `[spark.conf]` overrides them.
CLUSTER_DEFAULTS = {"spark.executor.cores": "1", "spark.executor.memory": "768m"}


def _class_data_option(archive_classes_to: Path | None) -> str:
    if archive_classes_to is not None:
        return f"-XX:ArchiveClassesAtExit={archive_classes_to}"
    archive = startup_archive()
    return f"-XX:SharedArchiveFile={archive}" if archive.exists() else ""


def build_session(
    settings: SparkSettings | None = None,
    app_name: str = "streamproof",
    *,
    archive_classes_to: Path | None = None,
    ui: bool = False,
) -> SparkSession:
    """Start (or reuse) the process's SparkSession with streamproof's defaults (``ui``: :func:`session_conf`)."""
    check_java()
    settings = settings or SparkSettings()
    if settings.on_this_machine:  # on a real cluster, executors must reach the driver at its own address
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(settings, archive_classes_to=archive_classes_to, ui=ui).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not settings.master.startswith("local"):
        ship_package(spark)
    return spark


def run_session(pipeline: PipelineSpec) -> SparkSession:
    """The session a run of ``pipeline`` works in (or its warm standby): its ``[spark]`` settings, named after it,
    its web UI served where :func:`ui_wanted` says.

    >>> spark = run_session(load_pipeline("examples/orders_to_delta.toml"))         # doctest: +SKIP
    >>> spark.sparkContext.appName                                                   # doctest: +SKIP
    'streamproof:orders-to-delta'
    """
    spark = build_session(pipeline.spark, app_name=f"streamproof:{pipeline.name}", ui=ui_wanted(pipeline.spark))
    refuse_unconditional_s3(spark, pipeline)
    return spark


def refuse_unconditional_s3(spark: SparkSession, pipeline: PipelineSpec) -> None:
    """Refuse, in one line, a run whose S3 buckets Hadoop's own configuration (``core-site.xml``, a bucket's key) tells
    to create without a condition: checked as soon as the run's JVM exists, before the run lock (itself a conditional
    create) is taken. The pipeline file's settings were checked when it loaded (``guarantees.storage_refusal``)."""
    buckets = sorted({str(where.bucket) for where in pipeline.locations if where.scheme == "s3a" and where.bucket})
    if not buckets:
        return
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]

    def sources_of(key: str) -> str:
        return ", ".join(hadoop.getPropertySources(key) or [])

    if reason := hadoop_refusal(pipeline.guarantee, buckets, hadoop.get, sources_of):
        raise ConfigError(reason)


def local_session(settings: SparkSettings | None = None, app_name: str = "streamproof") -> SparkSession:
    """A session in this process's own JVM (``local[2]``) with the pipeline's other settings (jars, storage
    configuration): for the crash harness's checks, which run beside the pipeline and must not take its cluster's
    executors, and for the tools that only read logs and tables (checkpoint commands)."""
    settings = settings or SparkSettings()
    return build_session(settings.model_copy(update={"master": "local[2]"}), app_name)


def ship_package(spark: SparkSession) -> Path:
    """The streamproof package, zipped once per content into the cache, added to the executors' Python path:
    a cluster's executors run the sinks' tasks (PostgreSQL, Kafka) with the driver's code, not an installed
    copy (their Python needs streamproof's dependencies, as the driver's does)."""
    package = Path(__file__).resolve().parent.parent  # streamproof/, of which this is jvm/session.py
    sources = sorted(path for path in package.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    archive = cache_root() / "packages" / f"streamproof-{digest.hexdigest()[:16]}.zip"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
            for path in sources:
                zipped.write(path, Path("streamproof") / path.relative_to(package))
        partial.rename(archive)
    spark.sparkContext.addPyFile(str(archive))
    return archive
