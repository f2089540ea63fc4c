"""What the first batch of a cold process pays, in-process, one fresh JVM per run.

Usage::

    python benchmarks/profile_cold_batch.py parse TOPIC [BOOTSTRAP]   # read, parse and cache 100,000 records of a
                                                                      #   4-partition topic three times: the cold
                                                                      #   round against two warm ones
    python benchmarks/profile_cold_batch.py tables plain              # a first batch's two Delta writes (478
    python benchmarks/profile_cold_batch.py tables prewarm            #   quarantined rows, then 500,000 rows) into
                                                                      #   new tables; prewarm: both tables created
                                                                      #   and loaded in a thread while the batch is
                                                                      #   parsed, then written through the
                                                                      #   transaction API

``parse`` reads the topic ``streamproof bench`` makes (``bench-orders-2000000-s7``) with the bench's transform and
prints, for each round, its seconds, the driver's share (building and analysing the plan) and the count job's task
and CPU seconds from the REST API. ``tables`` answers whether creating the tables beside the first batch's parse would
shorten the first batch (run the two modes alternately; each is a new JVM). Findings: docs/performance.md.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamproof.config import Transform
from streamproof.jvm.session import build_session
from streamproof.sinks.base import Batch
from streamproof.sinks.delta import append_batch, commit_keyed, start_transaction
from streamproof.transform.records import parse_records

SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
TRANSFORM = Transform.model_validate({"schema": SCHEMA, "required": ["event_id", "order_id"]})


def parse(spark: SparkSession, topic: str, bootstrap: str) -> None:
    app, ui = spark.sparkContext.applicationId, spark.sparkContext.uiWebUrl

    def api(path: str) -> Any:
        return json.load(urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/{path}"))

    for round_, first in enumerate((100_000, 200_000, 300_000)):
        offsets = {topic: {str(partition): first for partition in range(4)}}
        ends = {topic: {str(partition): first + 25_000 for partition in range(4)}}
        before = {job["jobId"] for job in api("jobs")}
        started = time.monotonic()
        reader = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        raw = reader.option("startingOffsets", json.dumps(offsets)).option("endingOffsets", json.dumps(ends)).load()
        parsed = parse_records(raw, TRANSFORM).cache()  # cache() analyses the plan: the driver's share
        planned = time.monotonic() - started
        rows = parsed.count()
        print(f"round {round_} ({'cold' if round_ == 0 else 'warm'}): {rows:,} records read, parsed and cached in "
              f"{time.monotonic() - started:.2f} s; plan built and analysed {planned:.2f} s", flush=True)  # fmt: skip
        for job in api("jobs"):
            if job["jobId"] not in before and job["name"].startswith("count"):
                stages = [task for stage in job["stageIds"] for task in api(f"stages/{stage}")]
                print(f"   count job: tasks {sum(s['executorRunTime'] for s in stages) / 1000:.2f} s, "
                      f"CPU {sum(s['executorCpuTime'] for s in stages) / 1e9:.2f} s", flush=True)  # fmt: skip
        parsed.unpersist()


def tables(spark: SparkSession, mode: str) -> None:
    base = tempfile.mkdtemp(prefix="streamproof-profile-cold-")
    quarantine, sink = f"{base}/quarantine", f"{base}/sink"

    def parsed_batch() -> DataFrame:
        fields = [F.concat(F.lit("ev-"), F.col("id").cast("string")).alias("event_id"),
                  F.format_string("ord-7-%08d", (F.rand(1) * 666_666).cast("int")).alias("order_id"),
                  F.format_string("cust-%05d", (F.rand(2) * 10_000).cast("int")).alias("customer_id"),
                  F.round(F.rand(3) * 500, 2).alias("amount"), F.lit("paid").alias("status"),
                  F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("event_time")]  # fmt: skip
        text = spark.range(500_000).select(F.to_json(F.struct(*fields)).alias("value"), "id")
        rows = text.select(F.from_json("value", SCHEMA).alias("r"), "id").select(
            "r.*", F.lit("orders").alias("_src_topic"), (F.col("id") % 4).cast("int").alias("_src_partition"),
            F.col("id").alias("_src_offset"),
        ).cache()  # fmt: skip
        rows.count()
        return rows

    schema = parsed_batch_schema(spark)  # in both modes, before the clock: a pipeline knows it before its batch
    started = time.monotonic()
    creating = None
    if mode == "prewarm":

        def create() -> None:
            for path in (quarantine, sink):
                DeltaTable.createIfNotExists(spark).location(path).addColumns(schema).execute()
                start_transaction(spark, path).snapshot().transactions()

        creating = threading.Thread(target=create)
        creating.start()
    rows = parsed_batch()
    parsed = time.monotonic() - started
    if creating is not None:
        creating.join()
    waited = time.monotonic() - started - parsed
    seconds = {}
    for name, path, frame in (("quarantine", quarantine, rows.limit(478)), ("sink", sink, rows)):
        batch = Batch("profile", 0, {"orders": {"0": 1}}, keyed=True, rows=1)
        begun = time.monotonic()
        if mode == "prewarm":
            commit_keyed(start_transaction(spark, path), frame, batch)
        else:
            append_batch(frame, path, batch)
        seconds[name] = time.monotonic() - begun
    whole = time.monotonic() - started
    print(
        f"{mode}: parse {parsed:.2f} s, waiting for the tables {waited:.2f} s, quarantine "
        f"{seconds['quarantine']:.2f} s, sink {seconds['sink']:.2f} s; the batch {whole:.2f} s",
        flush=True,
    )
    shutil.rmtree(base, ignore_errors=True)


def parsed_batch_schema(spark: SparkSession) -> Any:
    source = [F.lit("x").alias("_src_topic"), F.lit(1).alias("_src_partition"),
              F.lit(1).cast("long").alias("_src_offset")]  # fmt: skip
    return spark.range(1).select(F.from_json(F.lit("{}"), SCHEMA).alias("r")).select("r.*", *source).schema


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "parse"
    spark = build_session(ui=what == "parse")
    try:
        if what == "parse":
            parse(spark, sys.argv[2] if len(sys.argv) > 2 else "bench-orders-2000000-s7",
                  sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1:9092")  # fmt: skip
        elif what == "tables":
            tables(spark, sys.argv[2] if len(sys.argv) > 2 else "plain")
        else:
            raise SystemExit(f"unknown profile {what!r}: expected parse or tables")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
