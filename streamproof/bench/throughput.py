"""``streamproof bench throughput``: N order events (default 2,000,000, ~190 B of JSON, 4 partitions, 0.1% malformed)
already in Kafka, drained by the exactly-once Kafka -> Delta pipeline (``benchmarks/pipelines/throughput_delta.toml``
in a child process, as ``streamproof run --available-now`` runs it), against baselines of the same run: (a) the same
query writing plain Parquet at-least-once, (b) a ``confluent-kafka`` consumer reading the topic and only
deserialising the JSON, (c) Spark reading the topic and counting, (d) the same Delta pipeline at-least-once (the
cost of exactly-once on the same sink), (e) Spark's own Delta streaming sink as the Spark/Delta docs teach it
(``benchmarks/native_delta_sink.py``: what a user writes instead of streamproof, with no quarantine and no offsets
recorded), (f) the exactly-once pipeline on a topic of valid records only (what the malformed ones cost), (g)
kafka-delta-ingest on that topic when it is built (:mod:`streamproof.bench.kafka_delta_ingest`), both timed from their
launch; and the ceiling: Spark parsing a cached copy of the events as the pipeline does and writing Parquet. Then,
with the checkpoint and the tables on HDFS (when ``streamproof infra up --hdfs`` runs) and on S3 (``infra up --s3``):
the exactly-once Delta pipeline and Spark's own Delta sink, a run each, on S3 with its requests counted by kind and
per batch (S3 bills and throttles per request).

Example::

    $ streamproof bench throughput --events 500000 --json bench.json                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from pyspark import StorageLevel
from pyspark.sql import SparkSession

from streamproof.bench.common import (
    PIPELINES,
    Bench,
    PipelineRun,
    delete_quietly,
    phases_line,
    ratio,
    relocated,
    requests_of_run,
    rounded,
    stores_running,
    timed,
)
from streamproof.bench.kafka_delta_ingest import HOW_TO_BUILD, ingest_rate, installed_binary
from streamproof.checkpoint.folder import LEASE_ENV
from streamproof.config import KafkaSource, PipelineSpec, load_pipeline
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
    """The ceiling: the events cached in memory, then parsed as the pipeline parses them and written as
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


NO_RENEWAL_LEASE_S = "1e9"  # a lease no run outlives: the run lock is created and never renewed (the lease's cost)


@contextlib.contextmanager
def without_renewal() -> Iterator[None]:
    """The pipeline runs started inside, as child processes, hold the run lock without renewing it: the baseline of
    the lease's cost (renewals every third of the lease, and the checks before each write, which stay)."""
    before = os.environ.get(LEASE_ENV)
    os.environ[LEASE_ENV] = NO_RENEWAL_LEASE_S
    try:
        yield
    finally:
        os.environ.pop(LEASE_ENV) if before is None else os.environ.__setitem__(LEASE_ENV, before)


def figures_of_run(run: PipelineRun) -> dict[str, Any]:
    """What an operator reads of one of our runs: the whole run's rows/s, its first batch and the steady batches."""
    first = run.batches[0]["duration_s"] if run.batches else None
    last_from_launch = run.batches[-1]["t"] if run.batches else 0
    return {
        "rows_per_second": round(run.rows_per_second),
        # From the process's launch to its last commit: how kafka-delta-ingest is timed too.
        "rows_per_second_from_launch": round(run.rows_in / last_from_launch) if last_from_launch > 0 else None,
        "first_batch_s": rounded(first),
        # From the process's launch: the JVM's start, the checks and the tables' creation count too.
        "first_commit_from_launch_s": rounded(run.batches[0]["t"]) if run.batches else None,
        "steady_rows_per_second": round(run.steady_rows_per_second) or None,
        "batch_seconds": [rounded(batch["duration_s"]) for batch in run.batches],
    }


def figures_of_native(result: dict[str, Any]) -> dict[str, Any]:
    """:func:`figures_of_run` for a run of Spark's own Delta sink (its batches as its progress reports them)."""
    seconds, rows = result.get("batch_seconds", []), result.get("batch_rows", [])
    later = sum(seconds[1:])
    return {
        "rows_per_second": result["rows_per_second"],
        "first_batch_s": rounded(seconds[0]) if seconds else None,
        "first_commit_from_launch_s": result.get("first_commit_s"),
        "steady_rows_per_second": round(sum(rows[1:]) / later) if later else None,
        "batch_seconds": [rounded(value) for value in seconds],
    }


def figures_of_ingester(result: dict[str, Any]) -> dict[str, Any]:
    """:func:`figures_of_run` for a run of kafka-delta-ingest (:func:`ingest_rate`), timed from its launch: its
    first batch includes its start."""
    seconds, rows = result["batch_seconds"], result["batch_rows"]
    later = sum(seconds[1:])
    return {
        "rows_per_second": result["rows_per_second_from_launch"],
        "rows_per_second_from_launch": result["rows_per_second_from_launch"],
        "first_batch_s": rounded(seconds[0]) if seconds else None,
        "first_commit_from_launch_s": result["first_commit_from_launch_s"],
        "steady_rows_per_second": round(sum(rows[1:]) / later) if later else None,
        "batch_seconds": seconds,
    }


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the rounds (not the best: an operator gets the typical run), and the rounds.

    >>> def side(rate, first):
    ...     return {"rows_per_second": rate, "first_batch_s": first, "first_commit_from_launch_s": None,
    ...             "steady_rows_per_second": None, "batch_seconds": []}
    >>> medians([side(10, 3.0), side(30, 1.0), side(20, 2.0)])["rows_per_second"]
    20
    """
    summary: dict[str, Any] = {}
    figures = ("rows_per_second", "rows_per_second_from_launch", "first_batch_s", "first_commit_from_launch_s",
               "steady_rows_per_second")  # fmt: skip
    for figure in figures:
        values = [one[figure] for one in rounds if one.get(figure) is not None]
        summary[figure] = statistics.median(values) if values else None
    return {**summary, "rounds": rounds}


def side_ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    """Ours against theirs by the medians: whole run and steady batches as rows/s over rows/s, the first batch as
    their seconds over ours (above 1: ours is faster, in each)."""
    first_ours, first_theirs = ours["first_batch_s"], theirs["first_batch_s"]
    launch_ours, launch_theirs = ours.get("first_commit_from_launch_s"), theirs.get("first_commit_from_launch_s")
    return {
        "whole_run": ratio(ours["rows_per_second"], theirs["rows_per_second"]),
        "first_batch": ratio(first_theirs, first_ours) if first_ours and first_theirs else None,
        "first_commit_from_launch": ratio(launch_theirs, launch_ours) if launch_ours and launch_theirs else None,
        "steady_batches": ratio(ours["steady_rows_per_second"] or 0, theirs["steady_rows_per_second"] or 0)
        if theirs["steady_rows_per_second"]
        else None,
    }


def _median_run(runs: list[Any], rate: Callable[[Any], float] = lambda run: run.rows_per_second) -> Any:
    """The run of median ``rate`` (rows/s; the lower of the two middle ones), whose details the results keep.

    >>> _median_run([{"r": 3}, {"r": 1}, {"r": 2}, {"r": 4}], lambda run: run["r"])
    {'r': 2}
    """
    ordered = sorted(runs, key=rate)
    return ordered[(len(ordered) - 1) // 2]


def bench_throughput(bench: Bench, rounds: int = 3, state_dir: Path | None = None) -> dict[str, Any]:
    """Delta exactly-once against Spark's own Delta sink, the same run without lease renewals, Parquet and Delta
    at-least-once, the raw consumer, Spark's count and the ceiling; ``rounds`` interleaved rounds, the medians kept;
    then on the stores of ``state_dir``'s servers that run (:func:`on_stores`)."""
    topic = bench.topic(bench.events)
    # Valid records only: what malformed records cost us, and kafka-delta-ingest (it stops at one that does not fit).
    clean_topic = bench.topic(bench.events, malformed=0.0)
    ingester = installed_binary()
    if ingester is None:
        bench.emit(HOW_TO_BUILD)
    spec = load_pipeline(PIPELINES / "throughput_delta.toml")
    batch = spec.source.max_offsets_per_trigger if isinstance(spec.source, KafkaSource) else None
    # Rounds interleaved: on a shared 2-core machine a slow spell falls on every side alike.
    delta_runs, renewal_free_runs, files_runs, delta_alo_runs, native_runs = [], [], [], [], []
    clean_runs: list[PipelineRun] = []
    ingester_runs: list[dict[str, Any]] = []
    for round_number in range(1, rounds + 1):
        of = f"(round {round_number} of {rounds})"
        bench.emit(f"pipeline: Kafka -> Delta, exactly-once {of}")
        delta_file = bench.pipeline("throughput_delta", topic, f"throughput-delta-{round_number}")
        delta_runs.append(bench.drain(delta_file))
        bench.emit(f"the same exactly-once pipeline on a topic of valid records only {of}")
        clean_file = bench.pipeline("throughput_delta", clean_topic, f"throughput-clean-{round_number}")
        clean_runs.append(bench.drain(clean_file))
        if ingester is not None:
            bench.emit(f"kafka-delta-ingest on the topic of valid records only {of}")
            ingested = ingest_rate(
                ingester, bench.bootstrap, clean_topic, spec.transform.schema_, bench.workdir / f"kdi-{round_number}",
                events=bench.events, batch=batch or 500_000, timeout_s=3600,
            )  # fmt: skip
            bench.emit(f"  {ingested['rows_per_second_from_launch']:,} rows/s from its launch to its last commit")
            ingester_runs.append(ingested)
        bench.emit(f"baseline (e): Spark's own Delta streaming sink, the docs' code {of}")
        native_runs.append(native_delta_sink_rate(bench, delta_file, f"throughput-native-delta-{round_number}"))
        bench.emit(f"the lease's cost: the same exactly-once pipeline, its run lock never renewed {of}")
        with without_renewal():
            renewal_free_runs.append(
                bench.drain(bench.pipeline("throughput_delta", topic, f"throughput-no-renewal-{round_number}"))
            )
        bench.emit(f"baseline (a): the same query to plain Parquet, at-least-once {of}")
        files_runs.append(
            bench.drain(bench.pipeline("throughput_files", topic, f"throughput-files-alo-{round_number}"))
        )
        bench.emit(f"baseline (d): the same Delta pipeline, at-least-once {of}")
        delta_alo_runs.append(
            bench.drain(bench.pipeline("throughput_delta_alo", topic, f"throughput-delta-alo-{round_number}"))
        )
    delta, files, delta_alo = _median_run(delta_runs), _median_run(files_runs), _median_run(delta_alo_runs)
    native = _median_run(native_runs, lambda run: run["rows_per_second"])
    sides = {
        "delta_exactly_once": medians([figures_of_run(run) for run in delta_runs]),
        "native_delta_sink": medians([figures_of_native(run) for run in native_runs]),
        "delta_exactly_once_no_renewal": medians([figures_of_run(run) for run in renewal_free_runs]),
        "parquet_at_least_once": medians([figures_of_run(run) for run in files_runs]),
        "delta_at_least_once": medians([figures_of_run(run) for run in delta_alo_runs]),
        "delta_exactly_once_clean_topic": medians([figures_of_run(run) for run in clean_runs]),
        **({"kafka_delta_ingest_clean_topic": medians([figures_of_ingester(run) for run in ingester_runs])}
           if ingester_runs else {}),
    }  # fmt: skip
    over_native = side_ratios(sides["delta_exactly_once"], sides["native_delta_sink"])
    bench.emit(
        f"exactly-once over Spark's own Delta sink, by the medians of {rounds} rounds: {json.dumps(over_native)}"
    )
    bench.emit(f"where the time went, {delta.pipeline} (the median run; seconds; streamproof.pipeline.phases):")
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
    ceiling = ceiling_rate(spark, bench.bootstrap, topic, spec, bench.workdir / "ceiling")
    bench.emit(f"  {ceiling['rows_per_second']:,} rows/s")
    rate = sides["delta_exactly_once"]["rows_per_second"]
    ratios = {
        "delta_exactly_once_vs_parquet_at_least_once": ratio(rate, sides["parquet_at_least_once"]["rows_per_second"]),
        "delta_exactly_once_vs_consumer_read": ratio(rate, consumer["rows_per_second"]),
        "delta_exactly_once_vs_spark_count": ratio(rate, count["rows_per_second"]),
        "delta_exactly_once_vs_ceiling": ratio(rate, ceiling["rows_per_second"]),
        "delta_exactly_once_vs_delta_at_least_once": ratio(rate, sides["delta_at_least_once"]["rows_per_second"]),
        "exactly_once_over_native_delta_sink": over_native["whole_run"],
        "first_batch_native_over_exactly_once": over_native["first_batch"],
        "first_commit_from_launch_native_over_exactly_once": over_native["first_commit_from_launch"],
        "steady_exactly_once_over_native_delta_sink": over_native["steady_batches"],
        # The lease's cost: a run renewing its lock against the same run never renewing it (1.0: free).
        "exactly_once_vs_no_lease_renewal": ratio(rate, sides["delta_exactly_once_no_renewal"]["rows_per_second"]),
        # What 0.1% of malformed records cost: our rate on that topic over our rate on a topic of valid ones only.
        "malformed_topic_vs_clean_topic": ratio(rate, sides["delta_exactly_once_clean_topic"]["rows_per_second"]),
        # Both from the process's launch to the last commit, on the topic of valid records only.
        "clean_exactly_once_over_kafka_delta_ingest_from_launch": ratio(
            sides["delta_exactly_once_clean_topic"]["rows_per_second_from_launch"] or 0,
            sides["kafka_delta_ingest_clean_topic"]["rows_per_second_from_launch"] or 0,
        )
        if "kafka_delta_ingest_clean_topic" in sides
        else None,
        "steady_delta_exactly_once_vs_parquet_at_least_once": ratio(
            sides["delta_exactly_once"]["steady_rows_per_second"] or 0,
            sides["parquet_at_least_once"]["steady_rows_per_second"] or 0,
        ),
    }
    targets = {
        "delta_exactly_once_vs_ceiling >= 0.5": (ratios["delta_exactly_once_vs_ceiling"] or 0) >= 0.5,
        "exactly_once_over_native_delta_sink >= 1.3": (ratios["exactly_once_over_native_delta_sink"] or 0) >= 1.3,
        "first_batch_native_over_exactly_once >= 1.0": (ratios["first_batch_native_over_exactly_once"] or 0) >= 1.0,
        "steady_exactly_once_over_native_delta_sink >= 1.5": (ratios["steady_exactly_once_over_native_delta_sink"] or 0)
        >= 1.5,
        "delta_exactly_once_vs_delta_at_least_once >= 0.9": (ratios["delta_exactly_once_vs_delta_at_least_once"] or 0)
        >= 0.9,
        "malformed_topic_vs_clean_topic >= 0.95": (ratios["malformed_topic_vs_clean_topic"] or 0) >= 0.95,
        **({"clean_exactly_once_over_kafka_delta_ingest_from_launch >= 1.5":
            (ratios["clean_exactly_once_over_kafka_delta_ingest_from_launch"] or 0) >= 1.5} if ingester_runs else {}),
    }  # fmt: skip
    return {
        "events": bench.events,
        "topic": topic,
        "rounds": rounds,
        "medians": {
            name: {key: value for key, value in side.items() if key != "rounds"} for name, side in sides.items()
        },
        "sides": sides,
        "delta_exactly_once": delta.to_dict(),
        "parquet_at_least_once": files.to_dict(),
        "delta_at_least_once": delta_alo.to_dict(),
        "delta_exactly_once_clean_topic": _median_run(clean_runs).to_dict(),
        **(
            {
                "kafka_delta_ingest_clean_topic": _median_run(
                    ingester_runs, lambda run: run["rows_per_second_from_launch"]
                )
            }
            if ingester_runs
            else {}
        ),
        "native_delta_sink": native,
        "consumer_read": consumer,
        "spark_count": count,
        "ceiling": ceiling,
        "ratios": ratios,
        "targets_met": targets,
        "stores": on_stores(bench, topic, state_dir, rounds, local=rate) if state_dir is not None else {},
    }


def on_stores(bench: Bench, topic: str, state_dir: Path, rounds: int, *, local: float) -> dict[str, Any]:
    """The exactly-once Delta pipeline, the same without lease renewals, and Spark's own Delta sink with their
    checkpoints and tables on HDFS (when ``streamproof infra up --hdfs`` runs) and on S3 (``infra up --s3``),
    ``rounds`` interleaved rounds on ``topic``, the medians kept; their rate against the pipeline's on the local disk
    (``local``, rows/s, measured just before), and on S3 each run's requests by kind and per batch. The folders are
    deleted afterwards."""
    results: dict[str, Any] = {}
    for where, (root, server) in stores_running(bench, state_dir, "throughput").items():
        ours, renewal_free, theirs, requests = [], [], [], []
        try:
            for round_number in range(1, rounds + 1):
                of = f"(round {round_number} of {rounds})"
                pipeline_file = relocated(
                    bench.pipeline("throughput_delta", topic, f"throughput-{where}-{round_number}"),
                    str(root),
                    conf=server.spark_conf() if server is not None else None,
                )
                bench.emit(f"{where}: Kafka -> Delta, exactly-once, checkpoint and tables on {where} {of}")
                before = server.requests_served() if server is not None else Counter()
                run = bench.drain(pipeline_file)
                ours.append(figures_of_run(run))
                if server is not None:
                    requests.append(requests_of_run(bench, server, before, len(run.batches)))
                bench.emit(f"{where}: Spark's own Delta sink, the docs' code, checkpoint and table on {where} {of}")
                native = native_delta_sink_rate(
                    bench,
                    pipeline_file,
                    f"throughput-native-{where}-{round_number}",
                    table=str(root / f"native-{round_number}" / "orders"),
                    checkpoint=str(root / f"native-{round_number}" / "checkpoint"),
                )
                theirs.append(figures_of_native(native))
                bench.emit(f"{where}: the exactly-once pipeline, its run lock never renewed {of}")
                with without_renewal():
                    renewal_free.append(figures_of_run(bench.drain(relocated(
                        bench.pipeline("throughput_delta", topic, f"throughput-{where}-no-renewal-{round_number}"),
                        str(root),
                        conf=server.spark_conf() if server is not None else None,
                    ))))  # fmt: skip
        finally:
            delete_quietly(bench, root)
        sides = {
            "delta_exactly_once": medians(ours),
            "native_delta_sink": medians(theirs),
            "delta_exactly_once_no_renewal": medians(renewal_free),
        }
        over_native = side_ratios(sides["delta_exactly_once"], sides["native_delta_sink"])
        rate = sides["delta_exactly_once"]["rows_per_second"]
        results[where] = {
            "sides": sides,
            "ratios": {
                "exactly_once_over_native_delta_sink": over_native["whole_run"],
                "first_batch_native_over_exactly_once": over_native["first_batch"],
                "first_commit_from_launch_native_over_exactly_once": over_native["first_commit_from_launch"],
                "steady_exactly_once_over_native_delta_sink": over_native["steady_batches"],
                "exactly_once_vs_no_lease_renewal": ratio(
                    rate, sides["delta_exactly_once_no_renewal"]["rows_per_second"]
                ),
                f"exactly_once_{where}_vs_local": ratio(rate, local),
            },
            **({"requests": {"streamproof": requests}} if requests else {}),
        }
        bench.emit(f"{where}: {json.dumps(results[where]['ratios'])}")
    return results


PLOTTED_SIDES = {
    "delta_exactly_once": ("streamproof exactly-once", "tab:blue"),
    "native_delta_sink": ("Spark's own Delta sink", "tab:orange"),
    "delta_exactly_once_no_renewal": ("streamproof, lease never renewed", "tab:green"),
    "delta_exactly_once_clean_topic": ("streamproof, valid records only", "tab:purple"),
    "kafka_delta_ingest_clean_topic": ("kafka-delta-ingest, valid records only (from launch)", "tab:red"),
}


def plot_throughput(document: dict[str, Any], png: Path) -> Path | None:
    """Draw each round's batch durations, per side, into ``png`` (one panel for the local disk, one per store the
    bench measured on): the first batch and the steady ones as an operator sees them. None when the results hold no
    throughput benchmark.

    >>> results = json.loads(Path("benchmarks/results/x-throughput.json").read_text())  # doctest: +SKIP
    >>> plot_throughput(results, Path("benchmarks/results/x-throughput.png"))            # doctest: +SKIP
    """
    throughput = document.get("results", {}).get("throughput")
    if not throughput or "sides" not in throughput:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = {"local disk": throughput["sides"], **{where: one["sides"] for where, one in throughput["stores"].items()}}
    figure, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), dpi=100, squeeze=False)
    for axis, (where, sides) in zip(axes[0], panels.items(), strict=True):
        for name, (label, color) in PLOTTED_SIDES.items():
            for index, one in enumerate(sides.get(name, {}).get("rounds", [])):
                seconds = one["batch_seconds"]
                axis.plot(range(len(seconds)), seconds, marker="o", color=color, alpha=0.45 + 0.2 * (index == 0),
                          label=label if index == 0 else None)  # fmt: skip
        axis.set_title(f"{where}: {throughput['events']:,} events, {throughput['rounds']} rounds")
        axis.set_xlabel("batch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel("batch duration (s)")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="x-small", loc="upper right", framealpha=0.7)
    machine = document.get("machine", {})
    figure.suptitle(f"Kafka -> Delta, each round's batches ({machine.get('cores', '?')} cores, "
                    f"{str(machine.get('date', ''))[:10]})")  # fmt: skip
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)
    return png
