"""The Spark session gets Delta and the Kafka connector from the local jar cache (no download at run time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamproof.generator import generate
from streamproof.infra import KafkaBroker
from streamproof.jvm.jars import cache_root

pytestmark = pytest.mark.integration


def test_session_writes_delta_and_reads_kafka_from_cached_jars(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    jars = spark.sparkContext.getConf().get("spark.jars").split(",")
    assert jars and all(Path(jar).is_relative_to(cache_root() / "jars") for jar in jars)
    assert not spark.sparkContext.getConf().contains("spark.jars.packages")  # nothing resolved at run time

    spark.range(5).write.format("delta").save(str(tmp_path / "t"))
    assert spark.read.format("delta").load(str(tmp_path / "t")).count() == 5
    # A new table's first commit does not list its files in the checksum (streamproof.jvm.session: that list cost the
    # first batch a Spark job); the checksum itself is still written.
    checksum = json.loads((tmp_path / "t" / "_delta_log" / f"{0:020d}.crc").read_text())
    assert checksum["numFiles"] >= 1 and "allFiles" not in checksum

    generate(kafka_broker.bootstrap_servers, "jar-check", 25, partitions=2, seed=1)
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", "jar-check")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .count()
    )
    assert rows == 25


def test_sessions_start_from_the_class_data_archive_made_at_setup() -> None:
    from streamproof.config import SparkSettings
    from streamproof.jvm.session import session_conf, startup_archive

    assert startup_archive().exists(), "make setup did not produce the JVM class-data archive"
    options = session_conf(SparkSettings())["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={startup_archive()}" in options


def test_an_unusable_archive_falls_back_silently(tmp_path: Path) -> None:
    import subprocess

    from streamproof.jvm.session import _QUIET_CDS

    garbage = tmp_path / "stale.jsa"
    garbage.write_bytes(b"not an archive" * 100)
    done = subprocess.run(
        ["java", f"-XX:SharedArchiveFile={garbage}", *_QUIET_CDS.split(), "-version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert done.stdout == "" and "warning" not in done.stderr


def test_jit_setting_picks_c1_only_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamproof.config import SparkSettings
    from streamproof.errors import ConfigError
    from streamproof.jvm.session import JIT_ENV, session_conf

    def java_options(**settings: str) -> str:
        return session_conf(SparkSettings(**settings))["spark.driver.extraJavaOptions"]

    monkeypatch.delenv(JIT_ENV, raising=False)
    assert "TieredStopAtLevel" not in java_options()
    assert "-XX:CompileThresholdScaling=3" in java_options().split()
    assert "-XX:TieredStopAtLevel=1" in java_options(jit="quick-start")
    assert "CompileThresholdScaling" not in java_options(jit="quick-start")
    monkeypatch.setenv(JIT_ENV, "quick-start")
    assert "-XX:TieredStopAtLevel=1" in java_options()
    monkeypatch.setenv(JIT_ENV, "tiered")
    assert "TieredStopAtLevel" not in java_options(jit="quick-start")
    monkeypatch.setenv(JIT_ENV, "fast")
    with pytest.raises(ConfigError, match="STREAMPROOF_JIT='fast': expected tiered or quick-start"):
        java_options()


def test_gc_setting_picks_one_collector() -> None:
    from pydantic import ValidationError

    from streamproof.config import SparkSettings
    from streamproof.jvm.session import session_conf

    def java_options(**settings: str) -> list[str]:
        return session_conf(SparkSettings(**settings))["spark.driver.extraJavaOptions"].split()

    collectors = [option for option in java_options() if option.startswith("-XX:+Use") and option.endswith("GC")]
    assert collectors == ["-XX:+UseParallelGC"]
    assert "-XX:+UseG1GC" in java_options(gc="g1") and "-XX:+UseParallelGC" not in java_options(gc="g1")
    with pytest.raises(ValidationError, match="gc"):
        SparkSettings(gc="zgc")


def test_hadoop_s_own_configuration_turning_conditional_writes_off_is_refused_before_the_run_lock(
    tmp_path: Path,
) -> None:
    """A core-site.xml on HADOOP_CONF_DIR (as a cluster's gateway machine has one) telling one bucket's S3A to create
    without a condition, which no pipeline file shows: `streamproof run` refuses in one line, naming the key and the
    file it came from, as soon as its JVM exists: before the run lock (itself a conditional create) is written, so
    no S3 server is needed and none is reached."""
    import re

    from conftest import REPO, run_cli

    conf = tmp_path / "hadoop-conf"
    conf.mkdir()
    (conf / "core-site.xml").write_text(
        '<?xml version="1.0"?>\n<configuration>\n  <property><name>fs.s3a.bucket.prod.create.conditional.enabled'
        "</name><value>false</value></property>\n</configuration>\n"
    )
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(
        re.sub(r'checkpoint = "[^"]*"', 'checkpoint = "s3a://prod/checkpoints/orders"',
               (REPO / "examples" / "orders_to_delta.toml").read_text())  # fmt: skip
    )
    done = run_cli("run", str(pipeline), "--available-now", env={"HADOOP_CONF_DIR": str(conf)}, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "the bucket prod on s3a:// cannot guarantee exactly-once: " in error, error
    assert 'fs.s3a.bucket.prod.create.conditional.enabled = "false" (set in ' in error and "core-site.xml" in error
    assert "Traceback" not in done.stderr and "Py4J" not in done.stderr


def test_the_driver_heap_starts_at_driver_memory(spark: Any) -> None:
    """The shared session's JVM was started with its heap at ``driver_memory`` (2g): a JVM grown from its default
    start (1/64 of this machine's 24 GiB, 384 MB) would hold far less now, its first batch collected in full as it
    grew (streamproof.jvm.session.initial_heap_option)."""
    from streamproof.config import SparkSettings
    from streamproof.jvm.session import session_conf

    assert "-Xms2048m" in session_conf(SparkSettings())["spark.driver.extraJavaOptions"].split()
    assert "-Xms512m" in session_conf(SparkSettings(driver_memory="512m"))["spark.driver.extraJavaOptions"].split()
    runtime = spark._jvm.java.lang.Runtime.getRuntime()
    assert runtime.totalMemory() >= 0.9 * 2 * 2**30  # committed heap; max is 2g


def test_the_driver_collects_no_heap_for_class_metadata_before_256_mb(spark: Any) -> None:
    """The shared session's JVM runs with its first metadata threshold at 256 MB: at the JVM's default (21 MB) a
    fresh drain collected the whole heap 5 times as its classes loaded, once in its first batch
    (streamproof.jvm.session._CLASS_METADATA_THRESHOLD)."""
    from streamproof.config import SparkSettings
    from streamproof.jvm.session import session_conf

    assert "-XX:MetaspaceSize=256m" in session_conf(SparkSettings())["spark.driver.extraJavaOptions"].split()
    jvm = spark._jvm
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert int(diagnostics.getVMOption("MetaspaceSize").getValue()) == 256 * 2**20


def test_timestamps_are_int64_microseconds_and_a_table_written_both_ways_reads_back(spark: Any, tmp_path: Path) -> None:
    """A Delta table's timestamps are written as Parquet's INT64 microseconds, not INT96 (streamproof.jvm.session:
    INT96's dictionary cost a write task a fifth of its time), and a table whose older files hold INT96, as every
    table written before that change does, reads back every value, the oldest and latest Spark allows included. A
    record's offset gets no dictionary; another column does."""
    import datetime

    import pyarrow.parquet as pq

    table = str(tmp_path / "t")
    utc = datetime.UTC
    times = [
        datetime.datetime(1, 1, 1, tzinfo=utc),
        datetime.datetime(1582, 10, 4, 23, 59, 59, 999999, tzinfo=utc),
        datetime.datetime(1899, 12, 31, 12, 0, 0, 1, tzinfo=utc),
        datetime.datetime(2026, 11, 30, 12, 34, 56, 789012, tzinfo=utc),
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
        None,
    ]
    # 600 rows, 6 offsets and 6 partitions: a dictionary of either column would pay, so only the setting drops one.
    rows = [(f"written-{kind}", i % 6, i % 6, times[i % 6]) for kind in ("before", "after") for i in range(300)]
    schema = "written STRING, _src_partition INT, _src_offset BIGINT, event_time TIMESTAMP"
    before = spark.createDataFrame(rows[:300], schema).coalesce(1)
    ours = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")  # as the table was written before the change
    try:
        before.write.format("delta").save(table)
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", ours)
    spark.createDataFrame(rows[300:], schema).coalesce(1).write.format("delta").mode("append").save(table)

    kinds = {}
    for file in (tmp_path / "t").glob("*.parquet"):
        footer = pq.ParquetFile(file).metadata
        columns = {footer.schema.column(i).name: footer.row_group(0).column(i) for i in range(footer.num_columns)}
        kinds[pq.read_table(file, columns=["written"])["written"][0].as_py()] = columns
    assert kinds["written-before"]["event_time"].physical_type == "INT96"
    assert kinds["written-after"]["event_time"].physical_type == "INT64"
    assert "PLAIN_DICTIONARY" in kinds["written-after"]["_src_partition"].encodings
    assert not {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(kinds["written-after"]["_src_offset"].encodings)
    epoch, micro = datetime.datetime(1970, 1, 1, tzinfo=utc), datetime.timedelta(microseconds=1)
    read = spark.read.format("delta").load(table).selectExpr("written", "_src_offset", "unix_micros(event_time)")
    assert sorted(tuple(row) for row in read.collect()) == sorted(
        (written, offset, None if time is None else (time - epoch) // micro) for written, _, offset, time in rows
    )


def test_local_files_get_hadoop_s_own_permissions_and_link_answers_without_a_process(
    spark: Any, tmp_path: Path
) -> None:
    """The session's local file system (``fs.file.impl``) and FileContext's (``fs.AbstractFileSystem.file.impl``) are
    streamproof's: Hadoop without its native library ran `chmod` for every file it created and `readlink` twice for
    every rename of Spark's checkpoint logs and Delta's log store (5,640 processes in 80 batches, measured). Their
    answers are Hadoop's own RawLocalFileSystem's: a new file's permissions (a symbolic link's target changed, as
    `chmod` does; the sticky bit Hadoop's own way) and the status of a file, a folder, a link, a dangling link and a
    missing path, with and without the ``file:`` scheme."""
    import os
    import stat

    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI("file:///")
    assert jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf).getClass().getName() == (
        "dev.streamproof.fs.ForklessLocalFileSystem"
    )
    file_context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf)
    assert file_context.getDefaultFileSystem().getClass().getName() == "dev.streamproof.fs.ForklessLocalFs"
    ours, hadoop_s = jvm.dev.streamproof.fs.ForklessRawLocalFileSystem(), jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    for fs in (ours, hadoop_s):
        fs.initialize(uri, conf)
    hadoop_path = jvm.org.apache.hadoop.fs.Path

    (tmp_path / "file").write_text("twelve bytes")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")

    def link_status(fs: Any, path: str) -> tuple[Any, ...]:
        try:
            status = fs.getFileLinkStatus(hadoop_path(path))
        except Exception as error:
            return ("refused", "FileNotFoundException" in str(error))
        target = str(status.getSymlink()) if status.isSymlink() else None
        return (status.isSymlink(), status.isDirectory(), 0 if status.isDirectory() else status.getLen(), target)

    for name in ("file", "folder", "link", "dangling", "missing"):
        for path in (str(tmp_path / name), f"file:{tmp_path / name}"):
            assert link_status(ours, path) == link_status(hadoop_s, path), path
    assert link_status(ours, str(tmp_path / "link"))[0] is True  # a link is still told as one
    assert link_status(ours, str(tmp_path / "missing")) == ("refused", True)

    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    for mode in (0o644, 0o600, 0o755, 0o000, 0o1777, 0o751):
        modes = []
        for fs, side in ((ours, "ours"), (hadoop_s, "hadoop")):
            folder = tmp_path / f"{side}-{mode:o}"
            folder.mkdir()
            (folder / "file").write_text("x")
            (folder / "link").symlink_to(folder / "file")
            (folder / "dir").mkdir()
            for name in ("file", "link", "dir"):
                fs.setPermission(hadoop_path(str(folder / name)), permission(mode & 0o7777))
            modes.append(
                [stat.S_IMODE(os.stat(folder / name).st_mode) for name in ("file", "dir")]
                + [stat.S_ISLNK(os.lstat(folder / "link").st_mode)]
            )
            for name in ("file", "dir"):
                os.chmod(folder / name, 0o700)  # tmp_path stays removable
        assert modes[0] == modes[1], oct(mode)
    for fs in (ours, hadoop_s):
        try:
            fs.setPermission(hadoop_path(str(tmp_path / "missing")), permission(0o644))
        except Exception as error:
            assert "IOException" in str(error) or "NoSuchFile" in str(error) or "ExitCode" in str(error)
        else:
            raise AssertionError("a missing file's permissions were set")


def test_a_pipeline_s_own_driver_classpath_is_added_after_the_local_file_system_s_jar() -> None:
    """spark-submit loads ``fs.file.impl`` before ``spark.jars``: its class must stay on the driver's own classpath
    when a pipeline file sets ``spark.driver.extraClassPath`` too (theirs is kept, after it)."""
    import os

    from streamproof.config import SparkSettings
    from streamproof.jvm.jars import driver_classpath
    from streamproof.jvm.session import session_conf

    ours = os.pathsep.join(str(jar) for jar in driver_classpath())
    assert ours.endswith("streamproof-local-fs.jar")
    assert session_conf(SparkSettings())["spark.driver.extraClassPath"] == ours
    theirs = session_conf(SparkSettings(conf={"spark.driver.extraClassPath": "/opt/drivers/x.jar"}))
    assert theirs["spark.driver.extraClassPath"] == f"{ours}{os.pathsep}/opt/drivers/x.jar"
    assert theirs["spark.hadoop.fs.file.impl"] == "dev.streamproof.fs.ForklessLocalFileSystem"
