"""``streamproof bench latency``: a producer at a fixed rate (default 20,000 events/s) while the pipeline runs with
a processing-time trigger; per row, the Delta commit's timestamp minus the Kafka record's produce timestamp.

Example::

    $ streamproof bench latency --rate 20000 --seconds 60                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamproof.bench.common import MALFORMED, SEED, Bench, phases_line, ratio, rounded
from streamproof.config import Trigger, load_pipeline
from streamproof.generator import order_events
from streamproof.kafka_client import client_config, ensure_topic
from streamproof.pipeline.events import WARMING


def produce_steadily(bootstrap: str, topic: str, rate: int, seconds: float, stop: threading.Event) -> int:
    """Produce generated orders at ``rate`` events/s for ``seconds``, in 10 ms slices; return the count.

    Kafka stamps each record with its produce time (CreateTime), which the pipeline carries as
    ``_src_timestamp``: the start of the latency measured.
    """

    producer = Producer(client_config(bootstrap, **{"linger.ms": 5, "enable.idempotence": True}))
    total = int(rate * seconds)
    events = order_events(total, seed=SEED + 1, malformed=MALFORMED)
    sent = 0
    started = time.monotonic()
    while sent < total and not stop.is_set():
        due = min(total, int((time.monotonic() - started) * rate))
        for partition, key, value, _kind in (next(events) for _ in range(due - sent)):
            producer.produce(topic, value=value, key=key, partition=partition)
        sent = due
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(60)
    return sent


def commit_timestamps(table: Path) -> dict[str, int]:
    """Data file (relative path) -> timestamp in ms of the Delta commit that added it, from ``_delta_log``."""
    files: dict[str, int] = {}
    for commit_file in sorted((table / "_delta_log").glob("[0-9]*.json")):
        actions = [json.loads(line) for line in commit_file.read_text(encoding="utf-8").splitlines() if line]
        stamp = next(
            (
                a["commitInfo"].get("inCommitTimestamp") or a["commitInfo"]["timestamp"]
                for a in actions
                if "commitInfo" in a
            ),
            None,
        )
        for action in actions:
            if "add" in action and stamp is not None:
                files[action["add"]["path"]] = int(stamp)
    return files


def row_latencies(spark: SparkSession, table: Path, produced_from_ms: int = 0) -> dict[str, Any]:
    """Exact p50/p95/p99/max of (commit time - produce time) in seconds, over the rows of the table produced
    at or after ``produced_from_ms`` (epoch ms; 0: every row)."""

    stamps = commit_timestamps(table)
    commits = spark.createDataFrame(list(stamps.items()), "file STRING, commit_ms BIGINT")
    rows = (
        spark.read.format("delta")
        .load(str(table))
        .select(
            F.regexp_extract(F.col("_metadata.file_path"), r"([^/]+)$", 1).alias("file"),
            F.unix_millis("_src_timestamp").alias("produced_ms"),
        )
    )
    rows = rows.where(F.col("produced_ms") >= produced_from_ms)
    latency = rows.join(F.broadcast(commits), "file").select(
        ((F.col("commit_ms") - F.col("produced_ms")) / 1000.0).alias("s")
    )
    row = latency.agg(
        F.count("*").alias("rows"),
        F.percentile("s", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("p"),
        F.max("s").alias("max"),
        F.avg("s").alias("mean"),
    ).first()
    assert row is not None
    p50, p95, p99 = row["p"] if row["p"] else (None, None, None)
    return {
        "rows": row["rows"],
        "p50_s": rounded(p50),
        "p95_s": rounded(p95),
        "p99_s": rounded(p99),
        "max_s": rounded(row["max"]),
        "mean_s": rounded(row["mean"]),
    }


def bench_latency(
    bench: Bench, rate: int = 20_000, seconds: float = 60.0, trigger: str = "0 seconds"
) -> dict[str, Any]:
    """A steady producer at ``rate`` while the pipeline runs with a processing-time trigger: a fresh process as
    ``streamproof run`` starts it (cold), then a fresh process started with ``--warm-up`` (its batch path run on
    scratch copies before it reads), each on a topic of its own; the targets are the cold process's."""

    cold = _latency_of_a_fresh_process(bench, rate, seconds, trigger, warm_up=False)
    warmed = _latency_of_a_fresh_process(bench, rate, seconds, trigger, warm_up=True)
    first_minute, steady = cold["latency"], cold["latency_after_warmup"]
    return {
        **cold,
        "warm_up_run": warmed,
        "ratios": {
            "p99_first_minute_warm_up_over_cold": ratio(warmed["latency"]["p99_s"] or 0.0, first_minute["p99_s"] or 0.0)
        },
        "targets_met": {
            f"p99 over the first {seconds:.0f} s < 5 s": (first_minute["p99_s"] or 99) < 5.0,
            "p99 after warm-up < 2 s": (steady["p99_s"] or 99) < 2.0,
            f"with --warm-up: p99 over the first {seconds:.0f} s < 5 s": (warmed["latency"]["p99_s"] or 99) < 5.0,
        },
    }


def _latency_of_a_fresh_process(
    bench: Bench, rate: int, seconds: float, trigger: str, *, warm_up: bool
) -> dict[str, Any]:
    label = "warm-up" if warm_up else "cold"
    topic = f"bench-latency-{label}-{bench.workdir.name}"
    ensure_topic(bench.bootstrap, topic, 4)
    pipeline_file = bench.pipeline(
        "throughput_delta", topic, f"latency-{label}", trigger=Trigger(processing_time=trigger, available_now=False)
    )
    child = bench.child(pipeline_file, available_now=False, warm_up=warm_up)
    try:
        child.wait_for(lambda: child.run.query_started_at is not None, 600, "query start")
        time.sleep(3)  # past the first, empty trigger
        warmed = f" (started with --warm-up: {child.child.notices(WARMING)[-1]})" if warm_up else " (a cold process)"
        bench.emit(f"producing {rate:,} events/s for {seconds:.0f} s (trigger processingTime {trigger!r}){warmed}")
        stop = threading.Event()
        began_ms = int(time.time() * 1000)
        produced = produce_steadily(bench.bootstrap, topic, rate, seconds, stop)
        child.wait_for(lambda: child.run.rows_in >= produced, 300, f"all {produced:,} events committed")
        run = child.stop()
    finally:
        if child.running:
            child.kill()
    table = Path(load_pipeline(pipeline_file).sink_specs[0].path)  # type: ignore[union-attr]
    latencies = row_latencies(bench.spark(), table)
    # A fresh JVM compiles its hot code during the first batches, and the backlog they leave takes a while to
    # clear: the latency of the steady state is measured on the rows produced after the first quarter.
    warmup_s = seconds / 4
    steady = row_latencies(bench.spark(), table, produced_from_ms=began_ms + int(warmup_s * 1000))
    for what, figures in (("all rows", latencies), (f"after {warmup_s:.0f} s of warm-up", steady)):
        bench.emit(
            f"  end-to-end latency ({label}), {what}: p50 {figures['p50_s']} s, p95 {figures['p95_s']} s, "
            f"p99 {figures['p99_s']} s over {figures['rows']:,} rows"
        )
    bench.emit(
        "  where each batch's time went (seconds; a row's latency is about its wait before the trigger plus the batch):"
    )
    for batch in run.batches:
        bench.emit(f"    {phases_line(batch)}")
    durations = [b["duration_s"] for b in run.batches]
    return {
        "rate_per_s": rate,
        "seconds": seconds,
        "trigger": trigger,
        "produced": produced,
        "warm_up": child.child.notices(WARMING) if warm_up else None,
        "latency": latencies,
        "warmup_s": warmup_s,
        "latency_after_warmup": steady,
        "batches": len(run.batches),
        "batch_duration_s": {
            "median": rounded(statistics.median(durations)) if durations else None,
            "max": rounded(max(durations)) if durations else None,
        },
        "median_phases_s": median_phases(run.batches),
        "batch_phases_s": run.to_dict()["batch_phases_s"],
    }


def median_phases(batches: list[dict[str, Any]]) -> dict[str, float]:
    """The median seconds of each phase, and of the wait before the trigger, over batches that held rows.

    >>> median_phases([{"rows": 5, "queued_s": 1.0, "phases": {"plan": 0.1}},
    ...                {"rows": 9, "queued_s": 3.0, "phases": {"plan": 0.3}}, {"rows": 0, "phases": {}}])
    {'queued': 2.0, 'plan': 0.2}
    """
    held = [b for b in batches if b["rows"] > 0]
    names = list(dict.fromkeys(name for b in held for name in b["phases"]))
    queued = [b["queued_s"] for b in held if b.get("queued_s") is not None]
    medians = {"queued": statistics.median(queued)} if queued else {}
    medians.update({name: statistics.median(b["phases"].get(name, 0.0) for b in held) for name in names})
    return {name: round(seconds, 3) for name, seconds in medians.items()}
