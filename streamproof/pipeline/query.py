"""Wire source -> transform -> sink into one streaming query; run it, stop it cleanly, resume it.

``run`` blocks until the query ends: drained (``available_now``), ``max_batches`` reached, or SIGTERM /
Ctrl-C, which stop it at the next batch boundary. A restart resumes from the checkpoint. The run reports
through events (:mod:`streamproof.pipeline.events`).

Example::

    >>> from streamproof.config import load_pipeline
    >>> summary = run(load_pipeline("examples/orders_to_delta.toml"), available_now=True)  # doctest: +SKIP
    >>> summary.rows_in                                                                   # doctest: +SKIP
    100000
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from streamproof import sources
from streamproof.checkpoint.folder import RunLock
from streamproof.checkpoint.log import (
    commit_without_running,
    committed_batches,
    log_batch,
    logged_batches,
    next_batch_to_run,
)
from streamproof.checkpoint.marks import RunCounter
from streamproof.checkpoint.positions import HeldBeyond, held_beyond, refuse_unsafe_start, refuse_with_spark
from streamproof.checkpoint.start import StartingPoint
from streamproof.config import PipelineSpec
from streamproof.errors import PipelineError, first_line, is_transient
from streamproof.faults import points as faults
from streamproof.jvm.session import NO_DATA_BATCHES, SPARK_LOG_ENV, run_session
from streamproof.metrics import PipelineMetrics
from streamproof.pipeline.batches import BatchWriter, open_batch_path
from streamproof.pipeline.events import (
    METRICS,
    READY,
    REPLAYING,
    RESTARTING,
    SPARK_UI,
    WARMING,
    Event,
    Notice,
    RunSummary,
    side_channel,
)
from streamproof.pipeline.progress import ProgressEvents
from streamproof.pipeline.warm_up import warm_up as warm_up_on_scratch_copies
from streamproof.storage.location import Location
from streamproof.transform.records import stateful_stream


def start_query(
    spark: SparkSession, spec: PipelineSpec, batches: BatchWriter, *, available_now: bool, once: bool = False
) -> StreamingQuery:
    """Build and start the streaming query, wired for the pipeline's guarantee."""
    starting_offsets = None
    if batches.progress is not None:  # at-most-once: never replay; start after the last batch marked done
        batches.progress.wipe_spark_logs()
        starting_offsets = batches.progress.starting_offsets()
    stream = sources.read_stream(spark, spec, starting_offsets=starting_offsets)
    records = sources.parsed_records(stream, spec)
    parsed = stateful_stream(records, spec.transform)
    batches.create_quarantine_table(parsed)
    # A window is written by the first batch after the watermark passes its end: with no new data, only a batch
    # without data (Spark's no-data batch) writes it, and at the end of an available-now run only that one.
    spark.conf.set(NO_DATA_BATCHES, str(spec.transform.aggregate is not None).lower())
    stream_writer = (
        parsed.writeStream.queryName(spec.name)
        .option("checkpointLocation", str(spec.checkpoint_dir))
        .foreachBatch(batches)
    )
    if once:  # one batch: the one logged and not committed when there is one (a replay), then stop
        stream_writer = stream_writer.trigger(once=True)
    elif available_now or spec.trigger.available_now:
        stream_writer = stream_writer.trigger(availableNow=True)
    elif spec.trigger.processing_time:
        stream_writer = stream_writer.trigger(processingTime=spec.trigger.processing_time)
    return stream_writer.start()


def run(
    spec: PipelineSpec,
    *,
    available_now: bool = False,
    max_batches: int | None = None,
    on_event: Callable[[Event], None] | None = None,
    summary: RunSummary | None = None,
    once: bool = False,
    warm_up: bool = False,
) -> RunSummary:
    """Run a pipeline until drained (available-now), ``max_batches`` batches, or SIGTERM/SIGINT; ``once``: a
    single batch (``checkpoint rewind`` replays the batch logged and not committed with it); ``warm_up``: before
    reading the source, run the batch path on scratch copies (:mod:`streamproof.pipeline.warm_up`), so that the first
    batches are not cold. Refused while another process runs it (``run --standby`` waits instead:
    :func:`streamproof.pipeline.standby.run_standing_by`).

    ``on_event`` receives the run's events as they happen (:mod:`streamproof.pipeline.events`; the CLI prints
    their lines); they also go to ``$STREAMPROOF_EVENTS_FD`` when set. ``summary`` (optional) is updated as
    batches commit, for a caller that displays progress.
    """
    publish, summary = begin_run(spec, on_event, summary)
    return run_under_lock(
        spec, publish, summary, available_now=available_now, max_batches=max_batches, once=once, warm_up=warm_up
    )


def begin_run(
    spec: PipelineSpec, on_event: Callable[[Event], None] | None, summary: RunSummary | None
) -> tuple[Callable[[Event], None], RunSummary]:
    """What every run does first, before its JVM starts: crash points armed from the environment, Spark's log file
    named; returns how the run's events are published (to ``on_event`` and ``$STREAMPROOF_EVENTS_FD``) and the
    summary it keeps.

    >>> publish, summary = begin_run(spec, print, None)                                  # doctest: +SKIP
    """
    faults.arm_from_environment()
    _spark_log(spec)
    channel = side_channel()

    def publish(event: Event) -> None:
        if channel is not None:
            channel(event)
        if on_event is not None:
            on_event(event)

    return publish, summary or RunSummary(spec.name)


def _spark_log(spec: PipelineSpec) -> Path:
    """Where Spark's driver log of this run goes whole (stack traces too), beside the checkpoint when that is a local
    folder: the terminal shows a failure in one line and names this file. Set before the run's JVM starts."""
    state = spec.state_dir
    folder = state.path / "logs" if not state.is_remote else Path(".streamproof") / "logs" / spec.name
    path = folder.resolve() / f"spark-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    os.environ.setdefault(SPARK_LOG_ENV, str(path))
    return Path(os.environ[SPARK_LOG_ENV])


def session_before_lock(spec: PipelineSpec) -> SparkSession | None:
    """The session a run starts before it takes the run lock: a checkpoint on distributed storage is reached through
    Hadoop's FileSystem in Spark's JVM. None for a local one, checked first, so that a refusal costs no JVM start.

    >>> session_before_lock(load_pipeline("examples/orders_to_delta.toml")) is None     # doctest: +SKIP
    True
    """
    return run_session(spec) if spec.checkpoint_dir.is_remote else None


def run_under_lock(
    spec: PipelineSpec,
    publish: Callable[[Event], None],
    summary: RunSummary,
    *,
    taken: tuple[RunLock, SparkSession | None] | None = None,
    available_now: bool = False,
    max_batches: int | None = None,
    once: bool = False,
    warm_up: bool = False,
) -> RunSummary:
    """The run under the checkpoint's run lock: take it (unless ``taken``: the lock a standby took over, and its
    session), refuse an unsafe start, start Spark, refuse what needed it, open the batch path, run the batches; the
    lock released at the end. Every refusal comes before the batch path opens (it creates what a sink lacks) and
    before the start is counted.

    >>> run_under_lock(spec, print, RunSummary(spec.name), available_now=True)          # doctest: +SKIP
    """
    if taken is not None:
        lock, spark = taken
    else:
        spark = session_before_lock(spec)
        lock = RunLock(spec.checkpoint_dir).__enter__()
    try:
        held = refuse_unsafe_start(spark, spec)
        # Marks the end of Python's own start-up: the recovery benchmark splits a restart at this event.
        warm = "starting Spark" if spark is None else "Spark runs already (warm)"
        publish(Notice(spec.name, READY, f"checkpoint and sinks checked; {warm}"))
        spark = spark or run_session(spec)
        if address := spark.sparkContext.uiWebUrl:
            publish(Notice(spec.name, SPARK_UI, f"Spark UI at {address}"))
        held = refuse_with_spark(spark, spec, held)
        # What the sinks hold beyond the checkpoint, to replay first; refused here when it cannot be (a batch none
        # holds).
        beyond = held_beyond(spec, held.opened, held.start) if not once else HeldBeyond({})
        writer = open_batch_path(spark, spec, held.opened, publish, exactly_once=held.start.wiring.idempotent_sink)
        writer.lease_check = lock.check
        writer.fence(lock.holder_id)  # from here on, a store that can refuses an older holder's writes
        try:
            return _run_batches(
                spark, spec, held.start, beyond, writer, publish, summary, available_now, max_batches, once, warm_up
            )
        except Exception:
            # A run that lost its lease (paused, taken over, woken) fails on what the new holder wrote: Spark's
            # CONCURRENT_STREAM_LOG_UPDATE, a sink's refused commit. The lease is the cause to say, in one line.
            lock.check()
            raise
    finally:
        lock.__exit__()


def _run_batches(
    spark: SparkSession,
    spec: PipelineSpec,
    start: StartingPoint,
    beyond: HeldBeyond,
    writer: BatchWriter,
    publish: Callable[[Event], None],
    summary: RunSummary,
    available_now: bool,
    max_batches: int | None,
    once: bool,
    warm_up: bool,
) -> RunSummary:
    """Count the start, serve the metrics, then (after the warm-up, if asked) replay what the sinks hold beyond the
    checkpoint and run the query until it ends or is stopped, the run's progress events listened to."""
    stop = StopRequest()
    runs = RunCounter(spec.checkpoint_dir).count_start()
    metrics = PipelineMetrics(spec.name)
    metrics.observe_runs(runs)
    if spec.metrics.port is not None:
        metrics.serve(spec.metrics.port, spec.metrics.host)
        address = f"http://{spec.metrics.host}:{spec.metrics.port}/metrics"
        publish(Notice(spec.name, METRICS, f"metrics at {address}"))

    def on_batch(_: int) -> None:
        if max_batches is not None and summary.batches >= max_batches:
            stop.request(f"after {max_batches} batches", finish_in_flight=False)

    def on_signal(signum: int, _frame: object) -> None:
        stop.request(f"{signal.Signals(signum).name}", finish_in_flight=True)

    listener = ProgressEvents(spec, writer, summary, publish, on_batch, metrics)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    started, listening = time.monotonic(), False
    try:
        if warm_up:  # before the listener: the warm-up's batches are not the pipeline's
            _warm_up_and_say(spark, spec, stop, publish)
            started = time.monotonic()
            if stop.event.is_set():
                summary.stopped_by = f"{stop.reason} while warming up"
                return summary
        spark.streams.addListener(listener)
        listening = True
        if start.wiring.idempotent_sink and not once:
            _replay_what_the_sinks_hold(spark, spec, start, beyond, writer, stop, summary, publish)
        if not stop.event.is_set():
            query = _run_through_outages(
                spark, spec, writer, stop, summary, publish, available_now=available_now, once=once
            )
            _wait_for_last_progress(query, summary, writer)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if listening:
            spark.streams.removeListener(listener)
        summary.seconds = time.monotonic() - started
    return summary


def _replay_what_the_sinks_hold(
    spark: SparkSession,
    spec: PipelineSpec,
    start: StartingPoint,
    held: HeldBeyond,
    writer: BatchWriter,
    stop: StopRequest,
    summary: RunSummary,
    publish: Callable[[Event], None],
) -> None:
    """A checkpoint behind its sinks (an older backup restored, a rebuilt one): replay the batches they hold beyond
    it one at a time, each with the end offsets the sinks recorded (:func:`held_beyond`), so that every sink skips
    what it holds by the replay rule; Spark plans nothing anew until the checkpoint has caught up with the sinks.
    Planned by Spark instead, with more records in the source by then, those batches would cover other ranges.
    Those of a stateless pipeline that every sink holds are logged and marked done without running (each sink would
    only skip them): a restore far back costs no query per batch. Proven by ``tests/test_replay_through.py``."""
    if not held.offsets:
        return
    checkpoint = spec.checkpoint_dir
    first, last = min(held.offsets), max(held.offsets)
    span = f"batch {first}" if first == last else f"batches {first}-{last}"
    publish(
        Notice(
            spec.name,
            REPLAYING,
            f"the sinks hold {span} beyond the checkpoint's last committed batch {start.logs.committed[-1]} (an "
            "older checkpoint restored?): replaying them with the offsets the sinks recorded, each skipped where it "
            "is held",
        )
    )
    # A batch Spark logged already (in flight) counts if it ends where the sinks say.
    done = commit_without_running(checkpoint, held.offsets, list(held.everywhere))
    if done:
        which = f"batch {done[0]}" if len(done) == 1 else f"batches {done[0]}-{done[-1]}"
        publish(
            Notice(
                spec.name,
                REPLAYING,
                f"{which}: held by every sink with those offsets (a stateless pipeline): marked done without running",
            )
        )
    for batch_id, end_offsets in held.offsets.items():
        while not stop.event.is_set() and next_batch_to_run(checkpoint) <= batch_id:
            running = next_batch_to_run(checkpoint)
            if running == batch_id and batch_id not in logged_batches(checkpoint):
                log_batch(checkpoint, batch_id, end_offsets)
            query = _run_through_outages(spark, spec, writer, stop, summary, publish, available_now=False, once=True)
            _wait_for_last_progress(query, summary, writer)
            if not stop.event.is_set() and running not in committed_batches(checkpoint):
                raise PipelineError(
                    f"pipeline {spec.name!r}: replaying batch {running} with the offsets the sinks "
                    f"recorded did not commit it; the checkpoint is intact: start again"
                )


def _warm_up_and_say(
    spark: SparkSession, spec: PipelineSpec, stop: StopRequest, publish: Callable[[Event], None]
) -> None:
    publish(Notice(spec.name, WARMING, "warming up on scratch copies of the checkpoint and tables"))
    try:
        done = warm_up_on_scratch_copies(spark, spec, start_query, stop.event)
    except Exception as error:  # noqa: BLE001 - a cold start is still a start
        publish(Notice(spec.name, WARMING, f"warm-up failed ({first_line(error)}); starting cold"))
        return
    if not stop.event.is_set():
        publish(Notice(spec.name, WARMING, f"warm: {done.describe()}"))


def _run_through_outages(
    spark: SparkSession,
    spec: PipelineSpec,
    writer: BatchWriter,
    stop: StopRequest,
    summary: RunSummary,
    publish: Callable[[Event], None],
    *,
    available_now: bool,
    once: bool = False,
) -> StreamingQuery:
    """Run the query; when it stops because a server is briefly away (:func:`is_transient`), start it again
    from its checkpoint (the batch in flight is replayed, and the keyed sinks skip what they hold), until
    ``[retry] max_outage`` passes without a committed batch."""
    retry = spec.retry
    outage_began: float | None = None
    while True:
        batches_before = summary.batches
        query = start_query(spark, spec, writer, available_now=available_now, once=once)
        _wait(query, stop, summary, spec.checkpoint_dir)
        error = query.exception()
        if error is None:
            return query
        reason = first_line(error)
        if not is_transient(error) or stop.event.is_set():
            log = os.environ.get(SPARK_LOG_ENV)
            where = f" (Spark's log: {log})" if log and Path(log).exists() and "(traceback: " not in reason else ""
            raise PipelineError(f"pipeline {spec.name!r} failed: {reason}{where}")
        now = time.monotonic()
        outage_began = now if outage_began is None or summary.batches > batches_before else outage_began
        if now - outage_began + retry.backoff_s > retry.max_outage_s:
            raise PipelineError(
                f"pipeline {spec.name!r}: a server stayed unreachable for more than {retry.max_outage} ({reason}); "
                "the checkpoint is intact: start the pipeline again once it is back"
            )
        publish(
            Notice(
                spec.name,
                RESTARTING,
                f"query stopped by an unreachable server ({reason}); restarting it "
                f"from the checkpoint in {retry.backoff}",
            )
        )
        time.sleep(retry.backoff_s)


def _wait(query: StreamingQuery, stop: StopRequest, summary: RunSummary, checkpoint: Location) -> None:
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
    query: StreamingQuery, checkpoint: Location, *, finish_in_flight: bool, timeout_s: float = 600.0
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
        if (checkpoint / "commits" / str(in_flight)).is_file():
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
