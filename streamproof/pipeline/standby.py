"""A warm standby (``streamproof run PIPELINE --standby``): a second process of a running pipeline that starts its
Spark session, runs the pipeline's own batch path on a sample of its source into scratch tables, then waits; the
moment the running process stops or dies it takes the checkpoint's run lock and runs the pipeline from the
checkpoint, with a JVM that has loaded, generated and compiled the code a batch needs.

Why: after a SIGKILL a cold restart starts Python and a JVM, then runs its first batch on a cold JVM (class loading,
Spark's code generation, the JIT), which is most of the time to the next committed batch (docs/performance.md).

What it never does: write to the pipeline's checkpoint, tables or sinks before it holds the run lock (the warm-up
writes into a scratch copy beside the checkpoint, deleted after); take over from a process of another host (the
lock's liveness is checked on this host); take over while the dead holder's JVM still runs (a SIGKILL of the driver
alone leaves its JVM a moment longer: the standby waits for it, at most ``ORPHAN_WAIT_S``).

Example::

    $ streamproof run orders.toml &                 # the running pipeline
    $ streamproof run orders.toml --standby         # warm, waits; takes over when the first stops or dies
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from streamproof import faults
from streamproof.checkpoint.folder import Holder, RunLock, process_state
from streamproof.config import (
    AnySinkSpec,
    DeltaSinkSpec,
    DeltaSource,
    FilesSinkSpec,
    FilesSource,
    KafkaSource,
    MetricsSettings,
    PipelineSpec,
)
from streamproof.errors import PipelineError, first_line
from streamproof.faults import process_table
from streamproof.pipeline.batches import BatchWriter
from streamproof.pipeline.events import STANDBY, TOOK_OVER, Event, Notice
from streamproof.session import build_session, ui_wanted
from streamproof.sinks import open_sinks
from streamproof.storage import Location

POLL_S = 0.1  # how often the standby looks at the lock's holder
NOTE_FAMILY_S = 1.0  # how often it notes the processes the holder started (long-lived: its JVM)
ORPHAN_WAIT_S = 30.0  # how long the dead holder's own processes (its JVM) may outlive it before the standby refuses
WARM_RECORDS = 25_000  # Kafka records per warm-up batch (fewer when the pipeline's own batches are smaller)
WARM_TIMEOUT_S = 300.0
SCRATCH_MARK = ".standby-warmup-"  # <checkpoint>.standby-warmup-<pid>: the warm-up's checkpoint and tables
# How a query of a pipeline starts (streamproof.pipeline.query.start_query, which stands on this module).
StartQuery = Callable[..., StreamingQuery]


class StandbyStopped(Exception):  # noqa: N818 - a way out, not an error
    """SIGTERM or SIGINT while standing by: nothing was taken over."""


@dataclass(frozen=True)
class WarmUp:
    """What the warm-up ran: records through the batch path, batches, seconds."""

    records: int
    batches: int
    seconds: float


def stand_by(
    spec: PipelineSpec, lock: RunLock, holder: Holder, publish: Callable[[Event], None], start: StartQuery,
    spark: SparkSession | None = None,
) -> SparkSession:  # fmt: skip
    """Warm a session up (queries started with ``start``) and wait until ``lock`` (held by ``holder``) is free, then
    take it; returns the session, the lock held. Raises :class:`StandbyStopped` on SIGTERM / SIGINT while waiting."""
    if not holder.here:
        raise PipelineError(
            f"{lock.path.parent} is in use by pid {holder}: a standby takes over only from a process of its own host "
            "(it checks the holder's liveness): start the standby there"
        )
    stop, stopped_by = threading.Event(), []

    def on_signal(signum: int, _frame: object) -> None:
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    publish(Notice(spec.name, STANDBY, f"in use by pid {holder}: starting a warm standby"))  # stoppable from here
    try:
        spark = spark or build_session(spec.spark, app_name=f"streamproof:{spec.name}", ui=ui_wanted(spec.spark))
        _warm_up_and_say(spark, spec, start, stop, holder, publish)
        gone_at = _wait_for_lock(lock, holder, stop)
    except StandbyStopped as stopped:
        raise StandbyStopped(f"{stopped_by[0]} {stopped}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    taken_after = time.monotonic() - gone_at
    publish(Notice(spec.name, TOOK_OVER, f"took over from pid {holder} (gone; lock taken {taken_after:.2f} s later)"))
    return spark


def _warm_up_and_say(spark: SparkSession, spec: PipelineSpec, start: StartQuery, stop: threading.Event,
                     holder: Holder, publish: Callable[[Event], None]) -> None:  # fmt: skip
    try:
        warm = warm_up(spark, spec, start, stop)
    except Exception as error:  # noqa: BLE001 - a cold takeover is still a takeover
        publish(Notice(spec.name, STANDBY, f"standby warm-up failed ({first_line(error)}); waiting cold for pid "
                                           f"{holder} to stop"))  # fmt: skip
        return
    if stop.is_set():
        raise StandbyStopped(f"while warming up to stand by for pid {holder}")
    text = (f"standby warm ({warm.records:,} records, {warm.batches} batches through the batch path in "
            f"{warm.seconds:.1f} s); waiting for pid {holder} to stop")  # fmt: skip
    publish(Notice(spec.name, STANDBY, text))


def _wait_for_lock(lock: RunLock, holder: Holder, stop: threading.Event) -> float:
    """Wait for ``holder`` (and then whoever holds the lock next) to be gone, with its own processes, and take the
    lock; returns when the last holder was seen gone (monotonic)."""
    while True:
        family = _Family(holder.pid)
        while lock.holder() is not None:
            family.note_at_most_every(NOTE_FAMILY_S)
            if stop.wait(POLL_S):
                raise StandbyStopped(f"while standing by for pid {holder}")
        gone_at = time.monotonic()
        family.wait_gone(ORPHAN_WAIT_S, stop)
        taker = lock.try_acquire()
        if taker is None:
            return gone_at
        holder = taker  # another process started first: stand by for it


class _Family:
    """The processes a holder started (its JVM, PySpark's workers), noted while it lives: after the holder is gone
    they are no longer its children, and one of them may still be finishing a write."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.members: dict[int, str] = {}  # pid -> its start time (a pid reused later is another process)
        self.noted_at = float("-inf")

    def note_at_most_every(self, seconds: float) -> None:
        """:meth:`note`, unless it ran less than ``seconds`` ago (it reads the whole process table)."""
        if time.monotonic() - self.noted_at >= seconds:
            self.note()
            self.noted_at = time.monotonic()

    def note(self) -> None:
        children: dict[int, list[int]] = {}
        for info in process_table().values():
            children.setdefault(info.parent, []).append(info.pid)
        pending = list(children.get(self.root, []))
        while pending:
            pid = pending.pop()
            started = _start_time(pid)
            if started is not None:
                self.members[pid] = started
            pending.extend(children.get(pid, []))

    def alive(self) -> list[int]:
        return [pid for pid, started in self.members.items()
                if _start_time(pid) == started and process_state(pid) not in ("Z", None)]  # fmt: skip

    def wait_gone(self, timeout_s: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + timeout_s
        while left := self.alive():
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"the stopped pipeline's own processes (pids {', '.join(map(str, left))}) still run "
                    f"{timeout_s:.0f} s after it: they may still write; stop them, then start the pipeline again"
                )
            if stop.wait(POLL_S):
                raise StandbyStopped("while the stopped pipeline's processes ended")


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def warm_up(spark: SparkSession, spec: PipelineSpec, start: StartQuery,
            stop: threading.Event | None = None) -> WarmUp:  # fmt: skip
    """Run the pipeline's batch path (source, parse, cache and counts, quarantine, every sink's keyed commit) on a
    sample of its source into a scratch copy of its checkpoint and tables (:func:`warm_copy`): two batches, then one
    more after a restart of the query on that checkpoint, as a takeover's first batch runs (the first write of a
    run, on tables that exist). Crash points are disarmed meanwhile. The scratch copy is deleted after. ``stop``
    set: it ends at once.

    >>> warm_up(spark, load_pipeline("examples/orders_to_delta.toml"), start_query)    # doctest: +SKIP
    WarmUp(records=75000, batches=3, seconds=21.4)
    """
    started, stop = time.monotonic(), stop or threading.Event()
    scratch = spec.checkpoint_dir.with_name(f"{spec.checkpoint_dir.name}{SCRATCH_MARK}{Holder.me().pid}")
    _remove_leftovers(spec.checkpoint_dir)
    warm = warm_copy(spec, scratch)
    rows: dict[int, int] = {}  # by batch id: a batch the first query's stop cut short is run again by the second
    try:
        with faults.disarmed():
            for wanted in (2, 1):
                if stop.is_set():
                    break
                writer = BatchWriter(warm, open_sinks(warm))
                for sink in writer.sinks:
                    sink.prepare(spark)
                query = start(spark, warm, writer, available_now=True)
                deadline = time.monotonic() + WARM_TIMEOUT_S
                while query.isActive and len(writer.results) < wanted and time.monotonic() < deadline:
                    stop.wait(0.05)
                    if stop.is_set():
                        break
                query.stop()
                rows.update({batch_id: result.rows_in or 0 for batch_id, result in writer.results.items()})
    finally:
        for query in spark.streams.active:  # only the warm-up's run in this session yet
            query.stop()
        scratch.delete(recursive=True)
    return WarmUp(sum(rows.values()), len(rows), round(time.monotonic() - started, 1))


def warm_copy(spec: PipelineSpec, scratch: Location) -> PipelineSpec:
    """The pipeline with its checkpoint, quarantine and sinks under ``scratch``, reading a few small batches from the
    start of its source. Delta and Parquet sinks keep their kind and mode; PostgreSQL and Kafka sinks become scratch
    Delta tables (their Python tasks are not warmed, the JVM's side of the batch is).

    >>> warm_copy(spec, Location("/tmp/warm")).sink_specs[0].path                     # doctest: +SKIP
    '/tmp/warm/tables/orders'
    """
    sinks = [_scratch_sink(sink, scratch) for sink in spec.sink_specs]
    source = spec.source
    if isinstance(source, KafkaSource):
        size = min(WARM_RECORDS, source.max_offsets_per_trigger or WARM_RECORDS)
        source = source.model_copy(update={"starting_offsets": "earliest", "max_offsets_per_trigger": size})
    elif isinstance(source, FilesSource | DeltaSource):
        source = source.model_copy(update={"max_files_per_trigger": 1})
    return spec.model_copy(update={
        "name": f"{spec.name}-standby-warmup"[:100],
        "checkpoint": str(scratch / "checkpoint"),
        "source": source,
        "transform": spec.transform.model_copy(update={"quarantine": str(scratch / "tables" / "_quarantine")}),
        **({"sink": sinks[0]} if spec.sink is not None else {"sinks": sinks}),
        "metrics": MetricsSettings(),
    })  # fmt: skip


def _scratch_sink(sink: AnySinkSpec, scratch: Location) -> AnySinkSpec:
    path = str(scratch / "tables" / sink.name)
    if isinstance(sink, DeltaSinkSpec | FilesSinkSpec):
        return sink.model_copy(update={"path": path})
    return DeltaSinkSpec(kind="delta", label=sink.name, path=path)


def _remove_leftovers(checkpoint: Location) -> None:
    """Scratch copies of standbys of this host that died during their warm-up."""
    for name in checkpoint.parent.names():
        owner = name.rpartition(SCRATCH_MARK)[2] if name.startswith(checkpoint.name + SCRATCH_MARK) else ""
        if owner.isdigit() and not Holder(int(owner), Holder.me().host).alive():
            (checkpoint.parent / name).delete(recursive=True)
