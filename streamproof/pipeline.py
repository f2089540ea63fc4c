"""Wire source -> transform -> sink into one streaming query; run, stop cleanly, resume.

``run`` blocks until the query ends: drained (``available_now``), ``max_batches`` reached, or SIGTERM /
Ctrl-C, which stop it at the next batch boundary. A restart resumes from the checkpoint. One progress
line per committed batch goes to stdout; the harness reads those lines (:mod:`streamproof.prove`).

Example::

    >>> from streamproof.config import load_pipeline
    >>> summary = run(load_pipeline("examples/orders_to_delta.toml"), available_now=True)  # doctest: +SKIP
    [orders] batch 0 committed: 100000 rows in, 99900 to sink, 100 quarantined, 41,230 rows/s, ...
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamproof import faults, sources
from streamproof.checkpoint import RunLock, check_readable, committed_batches, logged_batches
from streamproof.config import PipelineSpec
from streamproof.errors import PipelineError, first_line, is_transient
from streamproof.metrics import PipelineMetrics, partition_lag
from streamproof.session import NO_DATA_BATCHES, build_session
from streamproof.sinks.base import open_sinks, refuse_if_checkpoint_lost
from streamproof.sinks.batch import BatchResult, BatchWriter
from streamproof.transform import check_derived_columns, parse_records, stateful_stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

PROCESS_READY = "starting Spark"
QUERY_STARTED = "query started"
BATCH_COMMITTED = "committed:"
# What readers of the progress lines (the crash harness, the bench) take from a batch line: batch id, rows in,
# seconds. It matches what format_batch_line prints.
BATCH_LINE_PATTERN = re.compile(r"batch (\d+) committed: (\d+) rows in, .*, ([\d.]+) s, kafka lag")


@dataclass
class RunSummary:
    pipeline: str
    batches: int = 0
    rows_in: int = 0
    rows_out: int = 0
    quarantined: int = 0
    seconds: float = 0.0
    stopped_by: str = "drained"
    batch_ids: list[int] = field(default_factory=list)

    last_rate: float = 0.0  # rows/s of the last batch
    last_lag: int | None = None  # Kafka records behind after the last batch

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0


def kafka_lag(source_progress: dict[str, Any]) -> int | None:
    """Records between the batch's end offsets and the latest offsets seen, summed over partitions.

    Offsets come as JSON text (``query.lastProgress``) or as objects (the listener's ``progress.json``).

    >>> kafka_lag({"endOffset": '{"t":{"0":5,"1":7}}', "latestOffset": {"t": {"0": 9, "1": 7}}})
    4
    """
    lags = partition_lag({"sources": [source_progress]})
    return sum(lag for partitions in lags.values() for lag in partitions.values()) if lags else None


def format_batch_line(
    name: str,
    batch_id: int,
    rows_in: int,
    rows_out: int,
    quarantined: int,
    rows_per_s: float,
    duration_s: float,
    lag: int | None,
) -> str:
    """The one progress line per committed batch.

    >>> format_batch_line("orders", 3, 1000, 990, 10, 52000.4, 1.234, 0)
    '[orders] batch 3 committed: 1000 rows in, 990 to sink, 10 quarantined, 52,000 rows/s, 1.2 s, kafka lag 0'
    """
    lag_text = "?" if lag is None else str(lag)
    return (
        f"[{name}] batch {batch_id} {BATCH_COMMITTED} {rows_in} rows in, {rows_out} to sink, "
        f"{quarantined} quarantined, {rows_per_s:,.0f} rows/s, {duration_s:.1f} s, kafka lag {lag_text}"
    )


def stateful_summary(result: BatchResult, spec: PipelineSpec) -> str:
    """What dedup and windows did in a batch, appended to its batch line, e.g.
    ``12 duplicates dropped, 3 late (quarantined)`` or ``40 windows closed, 3 late (dropped)``."""
    handled = "dropped" if spec.transform.late == "drop" else "quarantined"
    if spec.transform.aggregate is not None:
        return f"{result.rows_out} windows closed, {result.late} late ({handled})"
    return f"{result.duplicates_dropped} duplicates dropped, {result.late} late ({handled})"


def _rows_dropped_by_watermark(progress: dict[str, Any]) -> int | None:
    operators = progress.get("stateOperators") or []
    return sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in operators) if operators else None


def _progress_listener(
    spec: PipelineSpec,
    writer: BatchWriter,
    summary: RunSummary,
    emit: Callable[[str], None],
    on_batch: Callable[[int], None],
    metrics: PipelineMetrics | None = None,
) -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressLines(StreamingQueryListener):
        # Spark posts progress after it wrote commits/<batch>: the line means "durably done".
        def onQueryStarted(self, event: Any) -> None:
            emit(f"[{spec.name}] {QUERY_STARTED} (id {event.id}, run {event.runId})")

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            result = writer.results.pop(progress.batchId, None)
            rows_in = int(progress.numInputRows) if result is None or result.rows_in is None else result.rows_in
            duration = (progress.batchDuration or 0) / 1000.0
            document = json.loads(progress.json)
            sources = document.get("sources", [])
            lag = kafka_lag(sources[0]) if sources else None
            if result is None and rows_in == 0:
                return  # an idle trigger: no batch ran
            if metrics is not None:  # before the line: whoever sees the line finds the metrics up to date
                metrics.observe_batch(document, result.sink_rows if result else {},
                                      result.quarantined if result else 0)  # fmt: skip
            rows_out = result.rows_out if result else 0
            quarantined = result.quarantined if result else 0
            summary.batches += 1
            summary.rows_in += rows_in
            summary.rows_out += rows_out
            summary.quarantined += quarantined
            summary.batch_ids.append(progress.batchId)
            rate = rows_in / duration if duration > 0 else 0.0
            summary.last_rate, summary.last_lag = rate, lag
            line = format_batch_line(spec.name, progress.batchId, rows_in, rows_out, quarantined, rate, duration, lag)
            if result is not None and len(result.sink_seconds) > 1:
                line += "; " + ", ".join(f"{name} {sec:.1f} s" for name, sec in result.sink_seconds.items())
            if spec.transform.watermark is not None and result is not None:
                line += "; " + stateful_summary(result, spec)
                dropped_by_spark = _rows_dropped_by_watermark(document)
                # Windows count partial aggregates dropped, not records: comparable for dedup alone.
                if spec.transform.aggregate is None and dropped_by_spark not in (None, result.late):
                    line += f" (Spark's dedup operator counted {dropped_by_spark} late records: please report this)"
            if result is not None and result.replay_skipped:
                line += " (replayed batch: the sink already held it and skipped the write)"
            emit(line)
            on_batch(progress.batchId)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return ProgressLines()


def start_query(
    spark: SparkSession, spec: PipelineSpec, batches: BatchWriter, *, available_now: bool
) -> StreamingQuery:
    """Build and start the streaming query, wired for the pipeline's guarantee."""
    starting_offsets = None
    if batches.progress is not None:  # at-most-once: never replay; start after the last batch marked done
        batches.progress.wipe_spark_logs()
        starting_offsets = batches.progress.starting_offsets()
    stream = sources.read_stream(spark, spec, starting_offsets=starting_offsets)
    parsed = stateful_stream(parse_records(stream, spec.transform), spec.transform)
    # A window is written by the first batch after the watermark passes its end: with no new data, only a batch
    # without data (Spark's no-data batch) writes it, and at the end of an available-now run only that one.
    spark.conf.set(NO_DATA_BATCHES, str(spec.transform.aggregate is not None).lower())
    stream_writer = (
        parsed.writeStream.queryName(spec.name)
        .option("checkpointLocation", str(spec.checkpoint_dir))
        .foreachBatch(batches)
    )
    if available_now or spec.trigger.available_now:
        stream_writer = stream_writer.trigger(availableNow=True)
    elif spec.trigger.processing_time:
        stream_writer = stream_writer.trigger(processingTime=spec.trigger.processing_time)
    return stream_writer.start()


def run(
    spec: PipelineSpec,
    *,
    available_now: bool = False,
    max_batches: int | None = None,
    emit: Callable[[str], None] = lambda line: print(line, flush=True),
    summary: RunSummary | None = None,
) -> RunSummary:
    """Run a pipeline until drained (available-now), ``max_batches`` batches, or SIGTERM/SIGINT.

    ``summary`` (optional) is updated as batches commit, for a caller that displays progress.
    """
    faults.arm_from_environment()
    with RunLock(spec.checkpoint_dir):
        return _run_locked(spec, available_now, max_batches, emit, summary or RunSummary(spec.name))


def _run_locked(
    spec: PipelineSpec,
    available_now: bool,
    max_batches: int | None,
    emit: Callable[[str], None],
    summary: RunSummary,
) -> RunSummary:
    if spec.guarantee != "at-most-once":  # at-most-once wipes Spark's logs on every start
        check_readable(spec.checkpoint_dir, f"`streamproof checkpoint recover {spec._source_name}`")
    sources.require_available(spec)
    sinks = open_sinks(spec)
    refuse_if_checkpoint_lost(None, spec, sinks)  # before the JVM starts, for the sinks readable without it
    # Marks the end of Python's own start-up: the recovery benchmark splits a restart at this line.
    emit(f"[{spec.name}] {PROCESS_READY} (checkpoint and sinks checked)")
    spark = build_session(spec.spark, app_name=f"streamproof:{spec.name}")
    check_derived_columns(spark, spec.transform, exactly_once=spec.guarantee == "exactly-once")
    if any(sink.needs_spark_for_commits() for sink in sinks):
        refuse_if_checkpoint_lost(spark, spec, sinks)
    for sink in sinks:
        sink.prepare(spark)
    writer = BatchWriter(spec, sinks)
    stop = StopRequest()
    metrics = PipelineMetrics(spec.name)
    metrics.count_run(spec.checkpoint_dir)
    if spec.metrics.port is not None:
        metrics.serve(spec.metrics.port, spec.metrics.host)
        emit(f"[{spec.name}] metrics at http://{spec.metrics.host}:{spec.metrics.port}/metrics")

    def on_batch(_: int) -> None:
        if max_batches is not None and summary.batches >= max_batches:
            stop.request(f"after {max_batches} batches", finish_in_flight=False)

    def on_signal(signum: int, _frame: object) -> None:
        stop.request(f"{signal.Signals(signum).name}", finish_in_flight=True)

    listener = _progress_listener(spec, writer, summary, emit, on_batch, metrics)
    spark.streams.addListener(listener)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    try:
        query = _run_through_outages(spark, spec, writer, stop, summary, emit, available_now=available_now)
        _wait_for_last_progress(query, summary, writer)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        spark.streams.removeListener(listener)
        summary.seconds = time.monotonic() - started
    return summary


def _run_through_outages(
    spark: SparkSession,
    spec: PipelineSpec,
    writer: BatchWriter,
    stop: StopRequest,
    summary: RunSummary,
    emit: Callable[[str], None],
    *,
    available_now: bool,
) -> StreamingQuery:
    """Run the query; when it stops because a server is briefly away (:func:`is_transient`), start it again
    from its checkpoint (the batch in flight is replayed, and the keyed sinks skip what they hold), until
    ``[retry] max_outage`` passes without a committed batch."""
    retry = spec.retry
    outage_began: float | None = None
    while True:
        batches_before = summary.batches
        query = start_query(spark, spec, writer, available_now=available_now)
        _wait(query, stop, summary, spec.checkpoint_dir)
        error = query.exception()
        if error is None:
            return query
        reason = first_line(error)
        if not is_transient(error) or stop.event.is_set():
            raise PipelineError(f"pipeline {spec.name!r} failed: {reason}")
        now = time.monotonic()
        outage_began = now if outage_began is None or summary.batches > batches_before else outage_began
        if now - outage_began + retry.backoff_s > retry.max_outage_s:
            raise PipelineError(
                f"pipeline {spec.name!r}: a server stayed unreachable for more than {retry.max_outage} ({reason}); "
                "the checkpoint is intact: start the pipeline again once it is back"
            )
        emit(f"[{spec.name}] query stopped by an unreachable server ({reason}); restarting it from the checkpoint "
             f"in {retry.backoff}")  # fmt: skip
        time.sleep(retry.backoff_s)


def _wait(query: StreamingQuery, stop: StopRequest, summary: RunSummary, checkpoint: Path) -> None:
    while query.isActive:
        if stop.event.wait(0.2):
            summary.stopped_by = stop.reason
            _stop_at_batch_boundary(query, checkpoint, finish_in_flight=stop.finish_in_flight)
            return


@dataclass
class StopRequest:
    """Why the run should stop, and whether the batch being written should be finished first."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    finish_in_flight: bool = True

    def request(self, reason: str, *, finish_in_flight: bool) -> None:
        if not self.event.is_set():
            self.reason, self.finish_in_flight = reason, finish_in_flight
            self.event.set()


def _stop_at_batch_boundary(
    query: StreamingQuery, checkpoint: Path, *, finish_in_flight: bool, timeout_s: float = 600.0
) -> None:
    """Stop the query; with ``finish_in_flight``, first let the batch being written commit.

    Spark starts the next batch as soon as one commits when data keeps coming, so there is no idle moment
    to wait for; the batch whose offsets were logged when the stop was asked is finished instead. A batch
    interrupted by the stop has written nothing durable and is re-run on the next start (same offsets).
    """
    logged = logged_batches(checkpoint)
    in_flight = logged[-1] if logged and logged[-1] not in committed_batches(checkpoint) else None
    deadline = time.monotonic() + timeout_s
    while finish_in_flight and in_flight is not None and query.isActive and time.monotonic() < deadline:
        if (checkpoint / "commits" / str(in_flight)).exists():
            break
        time.sleep(0.05)
    query.stop()


def _wait_for_last_progress(
    query: StreamingQuery, summary: RunSummary, writer: BatchWriter, timeout_s: float = 30.0
) -> None:
    # Progress events reach the Python listener asynchronously; the last one may still be on its way
    # when the query ends, and its batch line must not be lost (nor the listener removed under it: a batch
    # without data that closed windows has a line too).
    last = query.lastProgress
    if last is None or (int(last["numInputRows"]) == 0 and last["batchId"] not in writer.results):
        return
    deadline = time.monotonic() + timeout_s
    while last["batchId"] not in summary.batch_ids and time.monotonic() < deadline:
        time.sleep(0.05)
