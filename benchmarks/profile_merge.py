"""Where a keyed Delta MERGE batch spends its time, and what changes it (in-process, one warm session).

Usage::

    python benchmarks/profile_merge.py jobs                 # each Spark job of a 500,000-row MERGE and of an 8-row one
    python benchmarks/profile_merge.py variants             # 4 batches: append, MERGE as streamproof does it, the
                                                            #   same MERGE without Delta's appId lookup, with
                                                            #   deletion vectors, with its materialised source in
                                                            #   memory (2 rounds)
    python benchmarks/profile_merge.py table-size 5000000   # MERGE batches of 20,000 and 500,000 rows into a table
                                                            #   of 5,000,000 keys, copy-on-write, then deletion vectors

The batches are shaped like ``bench sinks``' data: order ids drawn uniformly from a third as many orders as events,
so a 500,000-row batch updates most keys already held. Each MERGE is streamproof's
(:func:`streamproof.sinks.delta.latest_per_key`, the newer record wins) with the batch's appId and version in the
session confs, as :class:`streamproof.sinks.delta.DeltaSink` runs it. Findings: docs/performance.md.
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamproof.jvm.session import build_session
from streamproof.sinks.delta import TXN_APP_ID_CONF, TXN_VERSION_CONF, latest_per_key, newer_than

BATCH = 500_000
# Where Delta's MERGE keeps the source it materialises (a batch that is not a plain Delta scan): DISK_ONLY by default.
SOURCE_STORAGE_LEVEL_CONF = "spark.databricks.delta.merge.materializeSource.rddStorageLevel"


def orders(spark: SparkSession, first: int, count: int, keys: int, seed: int | None) -> DataFrame:
    """``count`` order events from ``first`` on; order ids uniform over ``keys`` (``seed`` None: one per event)."""
    order = (F.rand(seed) * keys).cast("int") if seed is not None else F.col("id")
    return (
        spark.range(first, first + count)
        .withColumn("event_id", F.concat(F.lit("ev-"), F.col("id").cast("string")))
        .withColumn("order_id", F.format_string("ord-7-%08d", order))
        .withColumn("customer_id", F.format_string("cust-%05d", (F.rand(7) * 10_000).cast("int")))
        .withColumn("amount", F.round(F.rand(8) * 500, 2))
        .withColumn("status", F.lit("paid"))
        .withColumn("event_time", F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")))
        .withColumn("_src_topic", F.lit("orders"))
        .withColumn("_src_partition", (F.col("id") % 4).cast("int"))
        .withColumn("_src_offset", F.col("id"))
        .drop("id")
    )


@contextmanager
def keyed(spark: SparkSession, version: int | None) -> Iterator[None]:
    """The batch's appId and version in the session confs for one MERGE (None: no key, no lookup)."""
    if version is not None:
        spark.conf.set(TXN_APP_ID_CONF, "profile")
        spark.conf.set(TXN_VERSION_CONF, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID_CONF)
        spark.conf.unset(TXN_VERSION_CONF)


def merge(spark: SparkSession, path: str, rows: DataFrame, version: int | None,
          properties: dict[str, str] | None = None, *, create: bool = False) -> None:  # fmt: skip
    """streamproof's MERGE of ``rows`` into ``path`` (``create``: the table is made first, with ``properties``)."""
    if create:
        created = DeltaTable.create(spark).location(path).addColumns(rows.schema)
        for name, value in (properties or {}).items():
            created = created.property(name, value)
        created.execute()
    with keyed(spark, version):
        (
            DeltaTable.forPath(spark, path).alias("t")
            .merge(latest_per_key(rows, "order_id", "event_time").alias("s"), "t.order_id = s.order_id")
            .whenMatchedUpdateAll(condition=newer_than("s", "t", "event_time"))
            .whenNotMatchedInsertAll()
            .execute()
        )  # fmt: skip


def scratch_table() -> str:
    path = tempfile.mkdtemp(prefix="streamproof-profile-merge-")
    shutil.rmtree(path)
    return path


def jobs(spark: SparkSession) -> None:
    """Four 500,000-row MERGE batches, then one of 8 rows: each job of the last two, from Spark's REST API."""
    app, ui = spark.sparkContext.applicationId, spark.sparkContext.uiWebUrl

    def listed() -> list[dict[str, Any]]:
        return json.load(urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/jobs"))

    def moment(text: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(text.replace("GMT", "+00:00"))

    batches = [orders(spark, i * BATCH, BATCH, BATCH * 4 // 3, i).cache() for i in range(4)]
    batches.append(orders(spark, 9 * BATCH, 8, BATCH * 4 // 3, 9).cache())
    path = scratch_table()
    for version, rows in enumerate(batches):
        rows.count()
        count = rows.count()
        before = {job["jobId"] for job in listed()}
        started = time.monotonic()
        merge(spark, path, rows, version, create=version == 0)
        seconds = time.monotonic() - started
        # What each batch paid before 8d8d3ca, timed after the MERGE so that it does not warm the MERGE's snapshot.
        begun = time.monotonic()
        DeltaTable.createIfNotExists(spark).location(path).addColumns(rows.schema).execute()
        created = time.monotonic() - begun
        print(f"batch {version} ({count:,} rows): {seconds:.2f} s (createIfNotExists on the table after it: "
              f"{created:.2f} s)", flush=True)  # fmt: skip
        if version < 3:
            continue
        for job in sorted(listed(), key=lambda job: job["jobId"]):
            if job["jobId"] not in before:
                seconds = (moment(job["completionTime"]) - moment(job["submissionTime"])).total_seconds()
                print(f"   {seconds:5.2f} s  {job.get('description', job['name'])[:100]}")
    shutil.rmtree(path, ignore_errors=True)


def variants(spark: SparkSession) -> None:
    """Four 500,000-row batches through each way of writing them, two rounds; seconds per batch."""
    batches = [orders(spark, i * BATCH, BATCH, BATCH * 4 // 3, i).cache() for i in range(4)]
    for rows in batches:
        rows.count()

    def append(path: str, rows: DataFrame, _: int) -> None:
        rows.write.format("delta").mode("append").save(path)

    ways: dict[str, Callable[[str, DataFrame, int], None]] = {
        "append": append,
        "merge (streamproof)": lambda path, rows, version: merge(spark, path, rows, version, create=version == 0),
        "merge without the appId lookup": lambda path, rows, version: merge(
            spark, path, rows, None, create=version == 0
        ),
        "merge with deletion vectors": lambda path, rows, version: merge(
            spark, path, rows, version, {"delta.enableDeletionVectors": "true"}, create=version == 0
        ),
        "merge, its source materialised in memory": lambda path, rows, version: in_memory(
            lambda: merge(spark, path, rows, version, create=version == 0)
        ),
    }

    def in_memory(action: Callable[[], None]) -> None:
        spark.conf.set(SOURCE_STORAGE_LEVEL_CONF, "MEMORY_AND_DISK")
        try:
            action()
        finally:
            spark.conf.unset(SOURCE_STORAGE_LEVEL_CONF)

    for round_ in ("warm-up", 1, 2):
        for name, write in ways.items():
            if round_ == "warm-up" and name != "append":
                continue
            path = scratch_table()
            seconds = []
            for version, rows in enumerate(batches):
                started = time.monotonic()
                write(path, rows, version)
                seconds.append(round(time.monotonic() - started, 2))
            print(f"round {round_}, {name}: {sum(seconds):.2f} s, batches {seconds}", flush=True)
            shutil.rmtree(path, ignore_errors=True)


def table_size(spark: SparkSession, keys: int) -> None:
    """A table of ``keys`` orders, then three MERGE batches of 20,000 and three of 500,000 random orders into it;
    copy-on-write, then the same with deletion vectors."""
    batches = {size: [orders(spark, 10**9 + i * size, size, keys, i).cache() for i in range(3)]
               for size in (20_000, BATCH)}  # fmt: skip
    for sized in batches.values():
        for rows in sized:
            rows.count()
    for layout, properties in (("copy-on-write", {}), ("deletion vectors", {"delta.enableDeletionVectors": "true"})):
        path = scratch_table()
        merge(spark, path, orders(spark, 0, keys, keys, None), None, properties, create=True)
        version = 0
        for size, sized in batches.items():
            seconds = []
            for rows in sized:
                started = time.monotonic()
                merge(spark, path, rows, version)
                seconds.append(round(time.monotonic() - started, 2))
                version += 1
            print(f"{layout}, {keys:,} keys, batches of {size:,}: {seconds} s", flush=True)
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "jobs"
    spark = build_session(ui=what == "jobs")
    try:
        if what == "jobs":
            jobs(spark)
        elif what == "variants":
            variants(spark)
        elif what == "table-size":
            table_size(spark, int(sys.argv[2]) if len(sys.argv) > 2 else 5_000_000)
        else:
            raise SystemExit(f"unknown profile {what!r}: expected jobs, variants or table-size")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
