"""Baseline of ``streamproof bench throughput``: what a user writes instead of streamproof, the code the Spark and
Delta docs teach, on the same topic, batch size, schema and Spark settings as the pipeline file given.

Usage::

    python benchmarks/native_delta_sink.py PIPELINE.toml OUT_FOLDER [TABLE [STARTING_OFFSETS_JSON [CHECKPOINT]]]

TABLE: the Delta table to append to (default ``OUT_FOLDER/orders``); STARTING_OFFSETS_JSON: where the query starts
(Spark's ``startingOffsets``; default ``earliest``); CHECKPOINT: the query's checkpoint (default
``OUT_FOLDER/checkpoint``; a URI for a table on HDFS).

``readStream`` from Kafka -> ``from_json`` with the declared schema -> keep records whose required fields are set ->
``writeStream.format("delta")`` with a checkpoint (exactly-once by Delta's own streaming sink, keyed on the query
id), ``availableNow``. No quarantine, no offsets recorded with the data, no crash check. Prints one JSON line:
``{"rows_in", "seconds", "batches", "batch_rows_per_second", "batch_duration_ms"}`` (Spark's steps of each batch),
where ``seconds`` runs from the query's start to its end (the last batch committed), as the pipeline's figure does;
also ``batch_seconds`` and ``first_commit_s``, seconds from the process's launch (``STREAMPROOF_BENCH_LAUNCHED_AT``,
epoch seconds, set by the bench) to its first batch with records reported done.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

from streamproof.config import KafkaSource, load_pipeline
from streamproof.jvm.session import build_session


def main(pipeline_file: str, out: str, table: str | None = None, starting_offsets: str = "earliest",
         checkpoint: str | None = None) -> None:  # fmt: skip
    spec = load_pipeline(pipeline_file)
    source = spec.source
    assert isinstance(source, KafkaSource), "the baseline reads a Kafka topic"
    spark = build_session(spec.spark, app_name="native-delta-sink")
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", source.bootstrap_servers)
        .option("subscribe", source.topic)
        .option("startingOffsets", starting_offsets)
    )
    if source.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", source.max_offsets_per_trigger)
    orders = reader.load().select(F.from_json(F.col("value").cast("string"), spec.transform.schema_).alias("o"))
    required = [F.col(f"o.{name}").isNotNull() for name in spec.transform.required]
    valid = orders.where(functools.reduce(lambda a, b: a & b, required, F.lit(True))).select("o.*")
    started = time.monotonic()
    query = (
        valid.writeStream.format("delta")
        .option("checkpointLocation", checkpoint or str(Path(out) / "checkpoint"))
        .trigger(availableNow=True)
        .start(table or str(Path(out) / "orders"))
    )
    first_commit_at = None
    while query.isActive:  # the first batch with records reported done: its commit is in
        if first_commit_at is None and any(p["numInputRows"] for p in query.recentProgress):
            first_commit_at = time.time()
        time.sleep(0.05)
    query.awaitTermination()
    seconds = time.monotonic() - started
    launched = float(os.environ.get("STREAMPROOF_BENCH_LAUNCHED_AT", "0")) or None
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    per_batch = [round(p["numInputRows"] / (p["batchDuration"] / 1000)) for p in progress if p["batchDuration"]]
    steps = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
    durations = [{step: p["durationMs"].get(step, 0) for step in steps} for p in progress]
    first = (first_commit_at or time.time()) - launched if launched else None
    print(json.dumps({"rows_in": rows, "seconds": round(seconds, 2), "batches": len(progress),
                      "batch_rows_per_second": per_batch, "batch_duration_ms": durations,
                      "batch_seconds": [p["batchDuration"] / 1000 for p in progress],
                      "batch_rows": [p["numInputRows"] for p in progress],
                      "first_commit_s": None if first is None else round(first, 3)}))  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
