"""``streamproof bench``: throughput, latency, recovery and per-sink speed, each against baselines of the same run.

Absolute figures on a shared 2-core machine move by 10-20% from one run to the next, so every benchmark
reports ratios between measurements taken in the same run, on the same data, one after the other:

* ``throughput``: N order events (default 2,000,000, ~190 B of JSON, 4 partitions, 0.1% malformed) already
  in Kafka, drained by the exactly-once Kafka -> Delta pipeline (``benchmarks/pipelines/throughput_delta.toml``
  in a child process, as ``streamproof run --available-now`` runs it). Baselines: (a) the same query writing
  plain Parquet at-least-once, (b) a ``confluent-kafka`` consumer reading the topic and only deserialising
  the JSON, (c) Spark reading the topic and counting, (d) the same Delta pipeline at-least-once (the cost
  of exactly-once on the same sink); and the ceiling: Spark parsing a cached copy of the
  events with ``from_json`` and writing Parquet.
* ``latency``: a producer at a fixed rate (default 20,000 events/s) while the pipeline runs with a
  processing-time trigger; per row, the Delta commit's timestamp minus the Kafka record's produce timestamp.
* ``recovery``: the pipeline SIGKILLed in the middle of a batch, restarted at once; kill -> first committed
  batch, split into process start (Python up, checkpoint and sinks checked), Spark session start (up to
  the query start) and catch-up (the replayed batch).
* ``sinks``: rows/s of Delta MERGE, PostgreSQL upsert, Kafka transactional and Parquet, on the same data.
* ``scaling``: the Delta pipeline on 1x, 2x and 4x N/2 events: rows/s, peak memory of the pipeline process
  tree, rows/s of every batch (``docs/performance.png`` is drawn from it with ``--plot``).

A pipeline's rate is its rows divided by the time from its ``query started`` line to its last committed
batch: JVM start-up is excluded from throughput and reported by ``recovery``.

Example::

    $ streamproof bench throughput --events 500000 --json bench.json                     # doctest: +SKIP
    throughput: Delta exactly-once 61,240 rows/s; vs Parquet at-least-once 0.91, vs ceiling 0.27 ...
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamproof.config import PipelineSpec, dump_pipeline, load_pipeline
from streamproof.errors import ConfigError, PipelineError
from streamproof.infra import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV
from streamproof.pipeline import BATCH_COMMITTED, BATCH_LINE_PATTERN, PROCESS_READY, QUERY_STARTED
from streamproof.session import JIT_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BENCHMARKS = ("throughput", "latency", "recovery", "sinks", "scaling", "tuning")
DEFAULT_EVENTS = 2_000_000
PIPELINES = Path(__file__).resolve().parent.parent / "benchmarks" / "pipelines"
RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
MALFORMED = 0.001
SEED = 7
Emit = Callable[[str], None]


@dataclass
class PipelineRun:
    """One pipeline child run as the benchmark saw it; times are seconds since the child was started."""

    pipeline: str
    rows_in: int = 0
    ready_at: float | None = None  # PROCESS_READY line: Python up, checkpoint and sinks checked
    query_started_at: float | None = None
    batches: list[dict[str, float]] = field(default_factory=list)  # {"t", "batch", "rows", "duration_s"}
    exit_code: int | None = None
    peak_memory_mb: float = 0.0
    wall_s: float = 0.0

    @property
    def seconds(self) -> float:
        """Query start -> last committed batch."""
        if self.query_started_at is None or not self.batches:
            return 0.0
        return self.batches[-1]["t"] - self.query_started_at

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_rows_per_second(self) -> float:
        """Rows/s of the batches after the first (a fresh JVM compiles its hot code during the first)."""
        later = [b for b in self.batches[1:] if b["rows"] > 0]
        seconds = sum(b["duration_s"] for b in later)
        return sum(b["rows"] for b in later) / seconds if seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "rows_in": self.rows_in, "seconds": round(self.seconds, 2),
            "rows_per_second": round(self.rows_per_second),
            "steady_rows_per_second": round(self.steady_rows_per_second), "wall_s": round(self.wall_s, 2),
            "peak_memory_mb": round(self.peak_memory_mb), "batches": len(self.batches),
            "batch_rows_per_second": [round(b["rows"] / b["duration_s"]) if b["duration_s"] else 0
                                      for b in self.batches],
        }  # fmt: skip


class Child:
    """``streamproof run PIPELINE`` as a child in its own session, its lines timed as they arrive."""

    def __init__(self, pipeline_file: Path, log_dir: Path, emit: Emit, *, available_now: bool = True) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.run = PipelineRun(pipeline_file.parent.name)
        self.emit = emit
        self.log_path = log_dir / f"{pipeline_file.parent.name}-{time.strftime('%H%M%S')}.log"
        self.scratch = log_dir / "spark-local"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_LOCAL_DIRS": str(self.scratch)}
        env.setdefault(JIT_ENV, "tiered")  # what `streamproof run` uses by default: the figures users get
        command = [sys.executable, "-m", "streamproof", "run", str(pipeline_file)]
        if available_now:
            command.append("--available-now")
        self.started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                start_new_session=True, env=env,
            )  # fmt: skip
        self.lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._sampler = threading.Thread(target=self._sample_memory, daemon=True)
        self._sampler.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            at = time.monotonic() - self.started
            line = raw.rstrip("\n")
            self.emit(line)
            with self.lock:
                if PROCESS_READY in line and self.run.ready_at is None:
                    self.run.ready_at = at
                elif QUERY_STARTED in line and self.run.query_started_at is None:
                    self.run.query_started_at = at
                elif match := BATCH_LINE_PATTERN.search(line):
                    rows = int(match.group(2))
                    self.run.rows_in += rows
                    self.run.batches.append(
                        {"t": at, "batch": int(match.group(1)), "rows": rows, "duration_s": float(match.group(3))}
                    )

    def _sample_memory(self) -> None:
        from streamproof.faults import process_tree_groups

        while self.process.poll() is None:
            total = _groups_pss_kb(set(process_tree_groups(self.process.pid)))
            self.run.peak_memory_mb = max(self.run.peak_memory_mb, total / 1024)
            time.sleep(0.5)

    def batches_committed(self) -> int:
        with self.lock:
            return len(self.run.batches)

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise PipelineError(f"the pipeline exited (code {self.process.returncode}) before {what}; "
                                    f"log: {self.log_path}")  # fmt: skip
            if time.monotonic() > deadline:
                self.kill()
                raise PipelineError(f"no {what} within {timeout_s:.0f} s (pipeline killed); log: {self.log_path}")
            time.sleep(0.02)

    def wait_for_batches(self, count: int, timeout_s: float) -> None:
        self.wait_for(lambda: self.batches_committed() >= count, timeout_s, f"{count} committed batches")

    def wait(self, timeout_s: float) -> PipelineRun:
        """Wait for the child to exit; a non-zero exit is an error (its log is named)."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise PipelineError(
                f"pipeline did not finish within {timeout_s:.0f} s (killed); log: {self.log_path}"
            ) from None
        self._reader.join(timeout=30)
        self.run.exit_code = self.process.returncode
        self.run.wall_s = time.monotonic() - self.started
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.process.returncode != 0:
            raise PipelineError(f"pipeline exited with code {self.process.returncode}; log: {self.log_path}")
        return self.run

    def stop(self, timeout_s: float = 120) -> PipelineRun:
        """SIGTERM: the pipeline finishes its batch in flight and exits 0."""
        os.kill(self.process.pid, signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> float:
        """SIGKILL the child's whole process tree; returns the moment of the kill (monotonic)."""
        from streamproof.faults import kill_process_tree

        at = time.monotonic()
        kill_process_tree(self.process.pid)
        self.process.wait(timeout=60)
        self._reader.join(timeout=30)
        shutil.rmtree(self.scratch, ignore_errors=True)
        return at


def _groups_pss_kb(groups: set[int]) -> int:
    """Proportional set size (kB) of the processes in ``groups``: shared pages are split among the processes
    sharing them, so a short-lived fork of the JVM does not count its heap twice (RSS would)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(") ", 1)[1].split()[2]) not in groups:
                continue
            rollup = (stat.parent / "smaps_rollup").read_text()
        except (OSError, IndexError, ValueError):
            continue
        match = re.search(r"^Pss:\s+(\d+) kB", rollup, re.MULTILINE)
        total += int(match.group(1)) if match else 0
    return total


@dataclass
class Bench:
    """What every benchmark shares: the broker, a work folder of this run, the events, the bench's Spark."""

    bootstrap: str
    workdir: Path
    events: int
    emit: Emit = print
    _spark: SparkSession | None = None

    def spark(self) -> SparkSession:
        """The bench's own session (baselines and latency analysis), built on first use."""
        if self._spark is None:
            from streamproof.config import SparkSettings
            from streamproof.session import build_session

            self._spark = build_session(SparkSettings(driver_memory="4g"), app_name="streamproof-bench")
        return self._spark

    def topic(self, events: int) -> str:
        """A 4-partition topic holding exactly ``events`` generated orders (reused when it already does)."""
        from streamproof.generator import generate, topic_end_offsets
        from streamproof.sources.kafka import topic_exists

        topic = f"bench-orders-{events}-s{SEED}"
        if topic_exists(self.bootstrap, topic):
            held = sum(topic_end_offsets(self.bootstrap, topic).values())
            if held == events:
                self.emit(f"using topic {topic}: {events:,} events already there")
                return topic
            topic = f"{topic}-{time.strftime('%H%M%S')}"
        result = generate(self.bootstrap, topic, events, partitions=4, malformed=MALFORMED, seed=SEED)
        self.emit(f"produced {events:,} events into {topic} in {result.seconds:.1f} s "
                  f"({result.records_per_second:,.0f} records/s, {result.malformed:,} malformed)")  # fmt: skip
        return topic

    def pipeline(self, template: str, topic: str, name: str, **changes: Any) -> Path:
        """``benchmarks/pipelines/<template>.toml`` on ``topic``, with its own checkpoint, tables and sink names."""
        from streamproof.prove import isolated_sink

        os.environ.setdefault(PG_PASSWORD_ENV, PG_DEFAULT_PASSWORD)  # the local server's, as infra starts it
        spec = load_pipeline(PIPELINES / f"{template}.toml")
        folder = self.workdir / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        sink = isolated_sink(spec.sink, folder) if spec.sink is not None else None
        if sink is not None and hasattr(sink, "bootstrap_servers"):
            sink = sink.model_copy(update={"bootstrap_servers": self.bootstrap})
        source = spec.source.model_copy(update={"topic": topic, "bootstrap_servers": self.bootstrap,
                                                **changes.pop("source", {})})  # fmt: skip
        updated: PipelineSpec = spec.model_copy(update={
            "name": f"{spec.name}-{folder.parent.name}-{name}"[:100],
            "checkpoint": str(folder / "checkpoint"),
            "source": source,
            "transform": spec.transform.model_copy(update={"quarantine": str(folder / "quarantine")}),
            "sink": sink,
            **changes,
        })  # fmt: skip
        pipeline_file = folder / "pipeline.toml"
        pipeline_file.write_text(dump_pipeline(updated))
        return pipeline_file

    def drain(self, pipeline_file: Path, timeout_s: float = 3600) -> PipelineRun:
        """Run the pipeline to the end of its topic in a child process."""
        child = Child(pipeline_file, self.workdir / "logs", self._quiet)
        run = child.wait(timeout_s)
        self.emit(f"  {run.pipeline}: {run.rows_in:,} rows in {run.seconds:.1f} s = {run.rows_per_second:,.0f} rows/s "
                  f"({len(run.batches)} batches, peak {run.peak_memory_mb:,.0f} MB)")  # fmt: skip
        return run

    def _quiet(self, line: str) -> None:
        if BATCH_COMMITTED in line or "error" in line.lower():
            self.emit("    " + line)


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator`` rounded to 3 places; None when the denominator is zero.

    >>> ratio(45.0, 50.0)
    0.9
    """
    return round(numerator / denominator, 3) if denominator else None


def timed(action: Callable[[], Any]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


# ---------------------------------------------------------------------------------------------- throughput


def consumer_read_rate(bootstrap: str, topic: str, expected: int, timeout_s: float = 600) -> dict[str, Any]:
    """Baseline (b): a ``confluent-kafka`` consumer reads every record and deserialises its JSON, nothing else."""
    from confluent_kafka import Consumer, TopicPartition

    from streamproof.generator import topic_end_offsets
    from streamproof.sources.kafka import client_config

    ends = topic_end_offsets(bootstrap, topic)
    consumer = Consumer(client_config(bootstrap, **{
        "group.id": f"streamproof-bench-{os.getpid()}", "enable.auto.commit": False,
        "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
    }))  # fmt: skip
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
                    json.loads(message.value())
                    parsed += 1
                except (ValueError, TypeError):
                    pass
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    if records < expected:
        raise PipelineError(f"the consumer baseline read {records:,} of {expected:,} records in {timeout_s:.0f} s")
    return {"records": records, "parsed": parsed, "seconds": round(seconds, 2),
            "rows_per_second": round(records / seconds)}  # fmt: skip


def spark_count_rate(spark: SparkSession, bootstrap: str, topic: str) -> dict[str, Any]:
    """Baseline (c): Spark reads the topic and counts (the second of two runs: the first warms the JVM)."""
    frame = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    counted = 0

    def count() -> None:
        nonlocal counted
        counted = frame.load().count()

    times = [timed(count) for _ in range(2)]
    return {"records": counted, "seconds": round(times[-1], 2), "rows_per_second": round(counted / times[-1]),
            "cold_seconds": round(times[0], 2)}  # fmt: skip


def ceiling_rate(spark: SparkSession, bootstrap: str, topic: str, spec: PipelineSpec, out: Path) -> dict[str, Any]:
    """The ceiling: the events cached in memory, then parsed with the pipeline's ``from_json`` and written as
    Parquet (best of two runs, the first warms the JVM); no Kafka, no batches, no commit protocol."""
    from pyspark import StorageLevel

    from streamproof.transform import parse_records, valid_records

    raw = (
        spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load()
        .select("topic", "partition", "offset", "timestamp", "value").persist(StorageLevel.MEMORY_ONLY)
    )  # fmt: skip
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
    return {"records": records, "seconds": round(best, 2), "rows_per_second": round(records / best),
            "runs_s": [round(t, 2) for t in times]}  # fmt: skip


def bench_throughput(bench: Bench, rounds: int = 2) -> dict[str, Any]:
    """Delta exactly-once against Parquet at-least-once, the raw consumer, Spark's count and the ceiling."""
    topic = bench.topic(bench.events)
    # Two rounds, interleaved, the faster run of each kept: on a shared 2-core machine one run in a few is
    # slowed by a neighbour, and interleaving spreads a slow spell over both sides of the ratio.
    delta_runs, files_runs, delta_alo_runs = [], [], []
    for round_number in range(1, rounds + 1):
        bench.emit(f"pipeline: Kafka -> Delta, exactly-once (round {round_number} of {rounds})")
        delta_runs.append(bench.drain(bench.pipeline("throughput_delta", topic, f"throughput-delta-{round_number}")))
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
    }
    targets = {
        "delta_exactly_once_vs_ceiling >= 0.5": (ratios["delta_exactly_once_vs_ceiling"] or 0) >= 0.5,
        "delta_exactly_once_vs_parquet_at_least_once >= 0.9":
            (ratios["delta_exactly_once_vs_parquet_at_least_once"] or 0) >= 0.9,
    }  # fmt: skip
    ratios["steady_delta_exactly_once_vs_parquet_at_least_once"] = ratio(
        delta.steady_rows_per_second, files.steady_rows_per_second
    )
    return {"events": bench.events, "topic": topic, "delta_exactly_once": delta.to_dict(),
            "parquet_at_least_once": files.to_dict(), "delta_at_least_once": delta_alo.to_dict(),
            "all_runs_rows_per_second": {"delta_exactly_once": [round(r.rows_per_second) for r in delta_runs],
                                         "parquet_at_least_once": [round(r.rows_per_second) for r in files_runs],
                                         "delta_at_least_once": [round(r.rows_per_second) for r in delta_alo_runs]},
            "consumer_read": consumer, "spark_count": count, "ceiling": ceiling, "ratios": ratios,
            "targets_met": targets}  # fmt: skip


# ------------------------------------------------------------------------------------------------- latency


def produce_steadily(bootstrap: str, topic: str, rate: int, seconds: float, stop: threading.Event) -> int:
    """Produce generated orders at ``rate`` events/s for ``seconds``, in 10 ms slices; return the count.

    Kafka stamps each record with its produce time (CreateTime), which the pipeline carries as
    ``_src_timestamp``: the start of the latency measured.
    """
    from confluent_kafka import Producer

    from streamproof.generator import order_events
    from streamproof.sources.kafka import client_config

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
        stamp = next((a["commitInfo"].get("inCommitTimestamp") or a["commitInfo"]["timestamp"]
                      for a in actions if "commitInfo" in a), None)  # fmt: skip
        for action in actions:
            if "add" in action and stamp is not None:
                files[action["add"]["path"]] = int(stamp)
    return files


def row_latencies(spark: SparkSession, table: Path, produced_from_ms: int = 0) -> dict[str, Any]:
    """Exact p50/p95/p99/max of (commit time - produce time) in seconds, over the rows of the table produced
    at or after ``produced_from_ms`` (epoch ms; 0: every row)."""
    from pyspark.sql import functions as F

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
    latency = rows.join(F.broadcast(commits), "file").select(((F.col("commit_ms") - F.col("produced_ms")) / 1000.0)
                                                             .alias("s"))  # fmt: skip
    row = latency.agg(
        F.count("*").alias("rows"),
        F.percentile("s", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))).alias("p"),
        F.max("s").alias("max"),
        F.avg("s").alias("mean"),
    ).first()
    assert row is not None
    p50, p95, p99 = row["p"] if row["p"] else (None, None, None)
    return {"rows": row["rows"], "p50_s": _r(p50), "p95_s": _r(p95), "p99_s": _r(p99), "max_s": _r(row["max"]),
            "mean_s": _r(row["mean"])}  # fmt: skip


def _r(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def bench_latency(bench: Bench, rate: int = 20_000, seconds: float = 60.0, trigger: str = "0 seconds"
                  ) -> dict[str, Any]:  # fmt: skip
    """A steady producer at ``rate`` while the pipeline runs with a processing-time trigger."""
    from streamproof.config import Trigger
    from streamproof.generator import ensure_topic

    topic = f"bench-latency-{bench.workdir.name}"
    ensure_topic(bench.bootstrap, topic, 4)
    pipeline_file = bench.pipeline("throughput_delta", topic, "latency",
                                   trigger=Trigger(processing_time=trigger, available_now=False))  # fmt: skip
    child = Child(pipeline_file, bench.workdir / "logs", bench._quiet, available_now=False)
    try:
        child.wait_for(lambda: child.run.query_started_at is not None, 300, "query start")
        time.sleep(3)  # past the first, empty trigger
        bench.emit(f"producing {rate:,} events/s for {seconds:.0f} s (trigger processingTime {trigger!r})")
        stop = threading.Event()
        began_ms = int(time.time() * 1000)
        produced = produce_steadily(bench.bootstrap, topic, rate, seconds, stop)
        child.wait_for(lambda: child.run.rows_in >= produced, 300, f"all {produced:,} events committed")
        run = child.stop()
    finally:
        if child.process.poll() is None:
            child.kill()
    table = Path(load_pipeline(pipeline_file).sink_specs[0].path)  # type: ignore[union-attr]
    latencies = row_latencies(bench.spark(), table)
    # A fresh JVM compiles its hot code during the first batches, and the backlog they leave takes a while to
    # clear: the latency of the steady state is measured on the rows produced after the first quarter.
    warmup_s = seconds / 4
    steady = row_latencies(bench.spark(), table, produced_from_ms=began_ms + int(warmup_s * 1000))
    for label, figures in (("all rows", latencies), (f"after {warmup_s:.0f} s of warm-up", steady)):
        bench.emit(f"  end-to-end latency, {label}: p50 {figures['p50_s']} s, p95 {figures['p95_s']} s, "
                   f"p99 {figures['p99_s']} s over {figures['rows']:,} rows")  # fmt: skip
    durations = [b["duration_s"] for b in run.batches]
    return {"rate_per_s": rate, "seconds": seconds, "trigger": trigger, "produced": produced,
            "latency": latencies, "warmup_s": warmup_s, "latency_after_warmup": steady, "batches": len(run.batches),
            "batch_duration_s": {"median": _r(statistics.median(durations)) if durations else None,
                                 "max": _r(max(durations)) if durations else None},
            "targets_met": {"p99 < 2 s": (latencies["p99_s"] or 99) < 2.0,
                            "p99 after warm-up < 2 s": (steady["p99_s"] or 99) < 2.0}}  # fmt: skip


# ------------------------------------------------------------------------------------------------ recovery


def bench_recovery(bench: Bench, kills: int = 3) -> dict[str, Any]:
    """SIGKILL mid-batch ``kills`` times; each restart timed from the kill to its first committed batch."""
    topic = bench.topic(bench.events)
    # About twenty batches, so that every kill lands inside a batch and leaves some to replay.
    batch = max(1_000, bench.events // 20)
    pipeline_file = bench.pipeline("throughput_delta", topic, "recovery", source={"max_offsets_per_trigger": batch})
    restarts = []
    child = Child(pipeline_file, bench.workdir / "logs", bench._quiet)
    try:
        for number in range(kills):
            child.wait_for_batches(child.batches_committed() + 2, 600)
            last = child.run.batches[-1]["duration_s"]
            time.sleep(last / 2)  # the middle of the next batch
            killed = child.kill()
            child = restarted = Child(pipeline_file, bench.workdir / "logs", bench._quiet)
            started = restarted.started
            restarted.wait_for_batches(1, 600)
            run = restarted.run
            assert run.ready_at is not None and run.query_started_at is not None
            split = {
                "kill_to_first_batch_s": _r(started - killed + run.batches[0]["t"]),
                "process_start_s": _r(started - killed + run.ready_at),
                "spark_session_start_s": _r(run.query_started_at - run.ready_at),
                "catch_up_s": _r(run.batches[0]["t"] - run.query_started_at),
            }
            bench.emit(f"  kill {number + 1}: {split['kill_to_first_batch_s']} s to the next committed batch "
                       f"(process {split['process_start_s']} s, Spark {split['spark_session_start_s']} s, "
                       f"catch-up {split['catch_up_s']} s)")  # fmt: skip
            restarts.append(split)
    finally:
        if child.process.poll() is None:
            child.kill()
    totals = [r["kill_to_first_batch_s"] for r in restarts]
    return {"kills": kills, "batch_rows": batch, "restarts": restarts, "median_s": _r(statistics.median(totals)),
            "max_s": _r(max(totals)), "targets_met": {"recovery < 20 s": max(totals) < 20.0}}  # fmt: skip


# --------------------------------------------------------------------------------------------------- sinks

SINK_PIPELINES = {"delta_merge": "sinks_delta_merge", "postgres_upsert": "sinks_postgres_upsert",
                  "kafka_transactional": "sinks_kafka", "files": "sinks_files"}  # fmt: skip


def bench_sinks(bench: Bench) -> dict[str, Any]:
    """rows/s of each exactly-once sink on the throughput data, and its ratio to Delta append in the same run."""
    topic = bench.topic(bench.events)
    results = {"delta_append": bench.drain(bench.pipeline("throughput_delta", topic, "sinks-delta-append")).to_dict()}
    for label, template in SINK_PIPELINES.items():
        bench.emit(f"sink: {label}")
        results[label] = bench.drain(bench.pipeline(template, topic, f"sinks-{label}")).to_dict()
    base = results["delta_append"]["rows_per_second"]
    return {"events": bench.events, "sinks": results,
            "ratios_vs_delta_append": {k: ratio(v["rows_per_second"], base) for k, v in results.items()}}  # fmt: skip


# ------------------------------------------------------------------------------------------------- scaling


def bench_scaling(bench: Bench) -> dict[str, Any]:
    """The Delta pipeline at N/2, N and 2N events: does the cost per row stay flat, does memory stay bounded?"""
    sizes = [bench.events // 2, bench.events, bench.events * 2]
    points = []
    for events in sizes:
        topic = bench.topic(events)
        run = bench.drain(bench.pipeline("throughput_delta", topic, f"scaling-{events}"))
        points.append({"events": events, **run.to_dict()})
    base = points[0]["rows_per_second"]
    for point in points:
        point["rows_per_second_vs_smallest"] = ratio(point["rows_per_second"], base)
    return {"points": points}


# ------------------------------------------------------------------------------------------------- tuning

FORMER_MAX_OFFSETS = 100_000


def bench_tuning(bench: Bench) -> dict[str, Any]:
    """Each default changed in the optimisation round, before and after, on the same data in the same run."""
    from streamproof import transform
    from streamproof.config import SparkSettings

    topic = bench.topic(bench.events)
    changes: dict[str, Any] = {}
    bench.emit(f"max_offsets_per_trigger: former default {FORMER_MAX_OFFSETS:,} vs the current one")
    before = bench.drain(bench.pipeline("throughput_delta", topic, "tuning-batch-before",
                                        source={"max_offsets_per_trigger": FORMER_MAX_OFFSETS}))  # fmt: skip
    after = bench.drain(bench.pipeline("throughput_delta", topic, "tuning-batch-after"))
    changes["max_offsets_per_trigger"] = {
        "before": before.to_dict(), "after": after.to_dict(),
        "speedup": ratio(after.rows_per_second, before.rows_per_second),
    }  # fmt: skip
    bench.emit("[spark] gc: G1 (the JVM's default, streamproof's former) vs the parallel collector")
    g1_runs, parallel_runs = [], []
    for round_number in (1, 2):
        g1_runs.append(bench.drain(bench.pipeline("throughput_delta", topic, f"tuning-gc-g1-{round_number}",
                                                  spark=SparkSettings(gc="g1"))))  # fmt: skip
        parallel_runs.append(
            bench.drain(bench.pipeline("throughput_delta", topic, f"tuning-gc-parallel-{round_number}"))
        )
    g1_rate = sum(run.rows_per_second for run in g1_runs) / 2
    parallel_rate = sum(run.rows_per_second for run in parallel_runs) / 2
    changes["gc"] = {
        "before": [run.to_dict() for run in g1_runs], "after": [run.to_dict() for run in parallel_runs],
        "speedup": ratio(parallel_rate, g1_rate),
        "peak_memory_ratio": ratio(
            sum(r.peak_memory_mb for r in parallel_runs), sum(r.peak_memory_mb for r in g1_runs)
        ),
    }  # fmt: skip
    bench.emit("parse once: from_json re-evaluated per filter reference (former plan) vs a generator barrier")
    spec = load_pipeline(PIPELINES / "throughput_delta.toml")
    rates = {}
    try:
        for label, parse_once in (("before", False), ("after", True)):
            transform.PARSE_ONCE = parse_once
            rates[label] = ceiling_rate(bench.spark(), bench.bootstrap, topic, spec, bench.workdir / "ceiling")
            bench.emit(f"  {label}: {rates[label]['rows_per_second']:,} rows/s")
    finally:
        transform.PARSE_ONCE = True
    changes["parse_once"] = {**rates, "speedup": ratio(rates["after"]["rows_per_second"],
                                                       rates["before"]["rows_per_second"])}  # fmt: skip
    return {"events": bench.events, "changes": changes}


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "throughput": bench_throughput, "latency": bench_latency, "recovery": bench_recovery, "sinks": bench_sinks,
    "scaling": bench_scaling, "tuning": bench_tuning,
}  # fmt: skip


def plot_scaling(document: dict[str, Any], png: Path) -> Path:
    """Draw rows/s of every batch of the scaling runs (one line per data size) into ``png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib (make setup installs it)") from None
    points = document["results"].get("scaling", {}).get("points")
    if not points:
        raise ConfigError("--plot draws the scaling benchmark: run `streamproof bench scaling --plot FILE`")
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for point in points:
        rates = point["batch_rows_per_second"]
        if len(rates) > 1 and rates[-1] < max(rates) / 100:
            rates = rates[:-1]  # the drain's last batch holds the few records left: its rate says nothing
        axes.plot(
            range(len(rates)), rates, marker="o", label=f"{point['events']:,} events ({point['batches']} batches)"
        )
    machine = document["machine"]
    axes.set_title(f"Kafka -> Delta exactly-once, rows/s per batch ({machine['cores']} cores, {machine['date'][:10]})")
    axes.set_xlabel("batch")
    axes.set_ylabel("rows/s (batch rows / batch duration)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)
    return png


def machine_facts() -> dict[str, Any]:
    """Cores, memory, versions and date, stored with every result."""
    import pyspark

    from streamproof.jars import cached_jars
    from streamproof.session import check_java

    memory_kb = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:")), 0)  # fmt: skip
    jars = {jar.name for jar in cached_jars("spark")} | {jar.name for jar in cached_jars("kafka")}
    delta_jar = next((n for n in jars if n.startswith("delta-spark")), "")
    kafka_jar = next((n for n in jars if re.match(r"kafka_2\.13-[\d.]+\.jar", n)), "")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 1024 / 1024, 1), "platform": platform.platform(),
        "python": platform.python_version(), "java": check_java(), "pyspark": pyspark.__version__,
        "delta_jar": delta_jar, "kafka_broker_jar": kafka_jar, "commit": commit or None,
    }  # fmt: skip


def check_request(names: list[str], events: int) -> None:
    """Refuse unknown benchmark names and data too small to measure anything but start-up (one line each).

    >>> check_request(["throughput"], 100_000)
    """
    unknown = [name for name in names if name not in RUNNERS]
    if unknown:
        raise ConfigError(f"unknown benchmark {unknown[0]!r}: expected one of {', '.join(BENCHMARKS)}")
    if events < 10_000:
        raise ConfigError(f"--events {events}: at least 10,000 (a benchmark of fewer measures only start-up)")


def run_benchmarks(names: list[str], *, bootstrap: str, state_dir: Path, events: int = DEFAULT_EVENTS,
                   emit: Emit = print, options: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the named benchmarks in order; return the results document (machine facts + one entry each)."""
    check_request(names, events)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    bench = Bench(bootstrap, state_dir / "bench" / stamp, events, emit)
    document: dict[str, Any] = {"machine": machine_facts(), "events": events, "results": {}}
    options = options or {}
    try:
        for name in names:
            emit(f"── {name} ──")
            started = time.monotonic()
            runner = RUNNERS[name]
            result = runner(bench, **options.get(name, {}))
            result["bench_seconds"] = round(time.monotonic() - started, 1)
            document["results"][name] = result
    finally:
        if bench._spark is not None:
            bench._spark.stop()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    return document


def write_results(document: dict[str, Any], results_dir: Path = RESULTS, json_file: Path | None = None) -> Path:
    """``<results_dir>/<date>-<names>.json`` (and ``json_file`` when given); returns the results path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    names = "-".join(document["results"])
    stamp = document["machine"]["date"].replace(":", "").replace("-", "")[:15]
    path = results_dir / f"{stamp}-{names}.json"
    text = json.dumps(document, indent=2)
    path.write_text(text)
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        json_file.write_text(text)
    return path
