"""``streamproof bench throughput``: N order events (default 2,000,000, ~190 B of JSON, 4 partitions, 0.1% malformed)
already in Kafka, drained by the exactly-once Kafka -> Delta pipeline (``benchmarks/pipelines/throughput_delta.toml``
in a child process, as ``streamproof run --available-now`` runs it), against baselines of the same run: (a) the same
query writing plain Parquet at-least-once, (b) a ``confluent-kafka`` consumer reading the topic and only
deserialising the JSON, (c) Spark reading the topic and counting, (d) the same Delta pipeline at-least-once (the
cost of exactly-once on the same sink), (e) Spark's own Delta streaming sink as the Spark/Delta docs teach it
(``benchmarks/native_delta_sink.py``: what a user writes instead of streamproof, with no quarantine and no offsets
recorded); and the ceiling: Spark parsing a cached copy of the events with ``from_json`` and writing Parquet. Then,
with the checkpoint and the tables on HDFS (when ``streamproof infra up --hdfs`` runs) and on S3 (``infra up --s3``):
the exactly-once Delta pipeline and Spark's own Delta sink, a run each, on S3 with its requests counted by kind and
per batch (S3 bills and throttles per request).

Example::

    $ streamproof bench throughput --events 500000 --json bench.json                     # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from pyspark import StorageLevel
from pyspark.sql import SparkSession

from streamproof.bench.common import (
    PIPELINES,
    Bench,
    delete_quietly,
    phases_line,
    ratio,
    relocated,
    requests_of_run,
    stores_running,
    timed,
)
from streamproof.config import PipelineSpec, load_pipeline
from streamproof.errors import PipelineError
from streamproof.jvm.session import JIT_ENV
from streamproof.kafka_client import client_config, topic_end_offsets
from streamproof.transform.records import parse_records, valid_records

# Baseline (e): the code a user would write instead of streamproof (benchmarks/, not the package: it is not ours).
NATIVE_DELTA_SINK = PIPELINES.parent / "native_delta_sink.py"


def consumer_read_rate(bootstrap: str, topic: str, expected: int, timeout_s: float = 600) -> dict[str, Any]:
    """Baseline (b): a ``confluent-kafka`` consumer reads every record and deserialises its JSON, nothing else."""

    ends = topic_end_offsets(bootstrap, topic)
    consumer = Consumer(
        client_config(
            bootstrap,
            **{
                "group.id": f"streamproof-bench-{os.getpid()}",
                "enable.auto.commit": False,
                "fetch.max.bytes": 52_428_800,
                "max.partition.fetch.bytes": 10_485_760,
            },
        )
    )
    consumer.assign([TopicPartition(topic, partition, 0) for partition in ends])
    records = parsed = 0
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        while records < expected and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error():
                    continue
                records += 1
                try:
                    json.loads(message.value() or b"")
                    parsed += 1
                except (ValueError, TypeError):
                    pass
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    if records < expected:
        raise PipelineError(f"the consumer baseline read {records:,} of {expected:,} records in {timeout_s:.0f} s")
    return {
        "records": records,
        "parsed": parsed,
        "seconds": round(seconds, 2),
        "rows_per_second": round(records / seconds),
    }


def spark_count_rate(spark: SparkSession, bootstrap: str, topic: str) -> dict[str, Any]:
    """Baseline (c): Spark reads the topic and counts (the second of two runs: the first warms the JVM)."""
    frame = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    counted = 0

    def count() -> None:
        nonlocal counted
        counted = frame.load().count()

    times = [timed(count) for _ in range(2)]
    return {
        "records": counted,
        "seconds": round(times[-1], 2),
        "rows_per_second": round(counted / times[-1]),
        "cold_seconds": round(times[0], 2),
    }


def ceiling_rate(spark: SparkSession, bootstrap: str, topic: str, spec: PipelineSpec, out: Path) -> dict[str, Any]:
    """The ceiling: the events cached in memory, then parsed with the pipeline's ``from_json`` and written as
    Parquet (best of two runs, the first warms the JVM); no Kafka, no batches, no commit protocol."""

    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .select("topic", "partition", "offset", "timestamp", "value")
        .persist(StorageLevel.MEMORY_ONLY)
    )
    records = raw.count()
    try:
        times = [
            timed(lambda: valid_records(parse_records(raw, spec.transform)).write.mode("overwrite").parquet(str(out)))
            for _ in range(2)
        ]
    finally:
        raw.unpersist()
        shutil.rmtree(out, ignore_errors=True)
    best = min(times)
    return {
        "records": records,
        "seconds": round(best, 2),
        "rows_per_second": round(records / best),
        "runs_s": [round(t, 2) for t in times],
    }


def native_delta_sink_rate(
    bench: Bench,
    pipeline_file: Path,
    name: str,
    timeout_s: float = 3600,
    *,
    table: str | None = None,
    starting_offsets: dict[str, Any] | None = None,
    checkpoint: str | None = None,
) -> dict[str, Any]:
    """Baseline (e): ``benchmarks/native_delta_sink.py``, Spark's own Delta streaming sink as its docs teach it, on the
    pipeline file's topic, batch size, schema and Spark settings, in a child process like the pipeline's; into
    ``table`` (default: a new one) from ``starting_offsets`` (Spark's ``{topic: {partition: offset}}``; default: the
    topic's start), its checkpoint at ``checkpoint`` (default: in the work folder)."""
    out = bench.workdir / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # What `streamproof run` uses, as for the pipeline's child; the launch time, for its first commit's figure.
    env = {**os.environ, JIT_ENV: "tiered", "STREAMPROOF_BENCH_LAUNCHED_AT": repr(time.time())}
    where = [
        str(table or out / "orders"),
        json.dumps(starting_offsets) if starting_offsets else "earliest",
        checkpoint or str(out / "checkpoint"),
    ]
    done = subprocess.run(
        [sys.executable, str(NATIVE_DELTA_SINK), str(pipeline_file), str(out), *where],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise PipelineError(f"{NATIVE_DELTA_SINK.name} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["rows_per_second"] = round(result["rows_in"] / result["seconds"]) if result["seconds"] else 0
    bench.emit(
        f"  native Delta sink: {result['rows_in']:,} rows in {result['seconds']:.1f} s = "
        f"{result['rows_per_second']:,} rows/s ({result['batches']} batches)"
    )
    return result


def bench_throughput(bench: Bench, rounds: int = 2, state_dir: Path | None = None) -> dict[str, Any]:
    """Delta exactly-once against Parquet at-least-once, the raw consumer, Spark's count and the ceiling; then on the
    stores of ``state_dir``'s servers that run (:func:`on_stores`)."""
    topic = bench.topic(bench.events)
    # Two rounds, interleaved, the faster run of each kept: on a shared 2-core machine one run in a few is
    # slowed by a neighbour, and interleaving spreads a slow spell over both sides of the ratio.
    delta_runs, files_runs, delta_alo_runs, native_runs = [], [], [], []
    for round_number in range(1, rounds + 1):
        bench.emit(f"pipeline: Kafka -> Delta, exactly-once (round {round_number} of {rounds})")
        delta_file = bench.pipeline("throughput_delta", topic, f"throughput-delta-{round_number}")
        delta_runs.append(bench.drain(delta_file))
        bench.emit(f"baseline (e): Spark's own Delta streaming sink, the docs' code (round {round_number} of {rounds})")
        native_runs.append(native_delta_sink_rate(bench, delta_file, f"throughput-native-delta-{round_number}"))
        bench.emit(f"baseline (a): the same query to plain Parquet, at-least-once (round {round_number} of {rounds})")
        files_runs.append(
            bench.drain(bench.pipeline("throughput_files", topic, f"throughput-files-alo-{round_number}"))
        )
        bench.emit(f"baseline (d): the same Delta pipeline, at-least-once (round {round_number} of {rounds})")
        delta_alo_runs.append(
            bench.drain(bench.pipeline("throughput_delta_alo", topic, f"throughput-delta-alo-{round_number}"))
        )
    delta = max(delta_runs, key=lambda run: run.rows_per_second)
    files = max(files_runs, key=lambda run: run.rows_per_second)
    delta_alo = max(delta_alo_runs, key=lambda run: run.rows_per_second)
    native = max(native_runs, key=lambda run: run["rows_per_second"])
    bench.emit(f"where the time went, {delta.pipeline} (seconds; streamproof.pipeline.phases):")
    for batch in delta.batches:
        bench.emit(f"  {phases_line(batch)}")
    bench.emit("the native sink's batches (Spark's steps; addBatch is its whole Delta write and commit):")
    for index, steps in enumerate(native.get("batch_duration_ms", [])):
        bench.emit(f"  batch {index}: " + ", ".join(f"{step} {ms / 1000:.2f}" for step, ms in steps.items()))
    bench.emit("baseline (b): confluent-kafka consumer, json.loads only")
    consumer = consumer_read_rate(bench.bootstrap, topic, bench.events)
    bench.emit(f"  {consumer['rows_per_second']:,} records/s")
    spark = bench.spark()
    bench.emit("baseline (c): Spark reads the topic and counts")
    count = spark_count_rate(spark, bench.bootstrap, topic)
    bench.emit(f"  {count['rows_per_second']:,} rows/s")
    bench.emit("ceiling: from_json + Parquet from a cached copy")
    spec = load_pipeline(PIPELINES / "throughput_delta.toml")
    ceiling = ceiling_rate(spark, bench.bootstrap, topic, spec, bench.workdir / "ceiling")
    bench.emit(f"  {ceiling['rows_per_second']:,} rows/s")
    rate = delta.rows_per_second
    ratios = {
        "delta_exactly_once_vs_parquet_at_least_once": ratio(rate, files.rows_per_second),
        "delta_exactly_once_vs_consumer_read": ratio(rate, consumer["rows_per_second"]),
        "delta_exactly_once_vs_spark_count": ratio(rate, count["rows_per_second"]),
        "delta_exactly_once_vs_ceiling": ratio(rate, ceiling["rows_per_second"]),
        "delta_exactly_once_vs_delta_at_least_once": ratio(rate, delta_alo.rows_per_second),
        "exactly_once_over_native_delta_sink": ratio(rate, native["rows_per_second"]),
    }
    targets = {
        "delta_exactly_once_vs_ceiling >= 0.5": (ratios["delta_exactly_once_vs_ceiling"] or 0) >= 0.5,
        "delta_exactly_once_vs_parquet_at_least_once >= 0.9": (
            ratios["delta_exactly_once_vs_parquet_at_least_once"] or 0
        )
        >= 0.9,
        "exactly_once_over_native_delta_sink >= 1.0": (ratios["exactly_once_over_native_delta_sink"] or 0) >= 1.0,
        "delta_exactly_once_vs_delta_at_least_once >= 0.9": (ratios["delta_exactly_once_vs_delta_at_least_once"] or 0)
        >= 0.9,
    }
    ratios["steady_delta_exactly_once_vs_parquet_at_least_once"] = ratio(
        delta.steady_rows_per_second, files.steady_rows_per_second
    )
    return {
        "events": bench.events,
        "topic": topic,
        "delta_exactly_once": delta.to_dict(),
        "parquet_at_least_once": files.to_dict(),
        "delta_at_least_once": delta_alo.to_dict(),
        "all_runs_rows_per_second": {
            "delta_exactly_once": [round(r.rows_per_second) for r in delta_runs],
            "parquet_at_least_once": [round(r.rows_per_second) for r in files_runs],
            "delta_at_least_once": [round(r.rows_per_second) for r in delta_alo_runs],
        },
        "native_delta_sink": native,
        "native_delta_sink_runs_rows_per_second": [run["rows_per_second"] for run in native_runs],
        "consumer_read": consumer,
        "spark_count": count,
        "ceiling": ceiling,
        "ratios": ratios,
        "targets_met": targets,
        "stores": on_stores(bench, topic, state_dir, local=rate) if state_dir is not None else {},
    }


def on_stores(bench: Bench, topic: str, state_dir: Path, *, local: float) -> dict[str, Any]:
    """The exactly-once Delta pipeline and Spark's own Delta sink with their checkpoints and tables on HDFS (when
    ``streamproof infra up --hdfs`` runs) and on S3 (``infra up --s3``), a run each on ``topic``; their rate against
    the pipeline's on the local disk (``local``, rows/s, measured just before), and on S3 each run's requests by kind
    and per batch. The folders are deleted afterwards."""
    results: dict[str, Any] = {}
    for where, (root, server) in stores_running(bench, state_dir, "throughput").items():
        try:
            pipeline_file = relocated(
                bench.pipeline("throughput_delta", topic, f"throughput-{where}"),
                str(root),
                conf=server.spark_conf() if server is not None else None,
            )
            bench.emit(f"{where}: Kafka -> Delta, exactly-once, checkpoint and tables on {where}")
            before = server.requests_served() if server is not None else Counter()
            run = bench.drain(pipeline_file)
            ours = requests_of_run(bench, server, before, len(run.batches)) if server is not None else None
            bench.emit(f"{where}: Spark's own Delta sink, the docs' code, checkpoint and table on {where}")
            before = server.requests_served() if server is not None else Counter()
            native = native_delta_sink_rate(
                bench,
                pipeline_file,
                f"throughput-native-{where}",
                table=str(root / "native" / "orders"),
                checkpoint=str(root / "native" / "checkpoint"),
            )
            theirs = requests_of_run(bench, server, before, native["batches"]) if server is not None else None
        finally:
            delete_quietly(bench, root)
        results[where] = {
            "delta_exactly_once": run.to_dict(),
            "native_delta_sink": native,
            "ratios": {
                "exactly_once_over_native_delta_sink": ratio(run.rows_per_second, native["rows_per_second"]),
                f"exactly_once_{where}_vs_local": ratio(run.rows_per_second, local),
            },
            **({"requests": {"streamproof": ours, "native": theirs}} if ours is not None else {}),
        }
        bench.emit(f"{where}: {json.dumps(results[where]['ratios'])}")
    return results
