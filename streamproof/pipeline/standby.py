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

from pyspark.sql import SparkSession

from streamproof.checkpoint.folder import Holder, RunLock, process_state
from streamproof.config import PipelineSpec
from streamproof.errors import PipelineError, first_line
from streamproof.faults.points import process_info, process_table
from streamproof.jvm.session import run_session
from streamproof.pipeline.events import STANDBY, TOOK_OVER, Event, Notice, RunSummary
from streamproof.pipeline.query import begin_run, run_under_lock, session_before_lock, start_query
from streamproof.pipeline.warm_up import warm_up as warm_up_on_scratch_copies

POLL_S = 0.1  # how often the standby looks at the lock's holder
NOTE_FAMILY_S = 1.0  # how often it notes the processes the holder started (long-lived: its JVM)
ORPHAN_WAIT_S = 30.0  # how long the dead holder's own processes (its JVM) may outlive it before the standby refuses


class StandbyStopped(Exception):  # noqa: N818 - a way out, not an error
    """SIGTERM or SIGINT while standing by: nothing was taken over."""


def run_standing_by(
    spec: PipelineSpec,
    *,
    available_now: bool = False,
    max_batches: int | None = None,
    on_event: Callable[[Event], None] | None = None,
    summary: RunSummary | None = None,
    warm_up: bool = False,
) -> RunSummary:
    """``streamproof run --standby``: run the pipeline as :func:`streamproof.pipeline.query.run` does, or, while
    another process of this host runs it, stand by warm (:func:`stand_by`) and run it from the moment that one stops
    or dies. SIGTERM / SIGINT while standing by: nothing is taken over, and ``summary.stopped_by`` says so.

    >>> run_standing_by(load_pipeline("orders.toml")).stopped_by                       # doctest: +SKIP
    'SIGTERM while standing by for pid 4242@host'
    """
    publish, summary = begin_run(spec, on_event, summary)
    spark = session_before_lock(spec)
    lock = RunLock(spec.checkpoint_dir)
    if (holder := lock.try_acquire()) is not None:
        try:
            spark = stand_by(spec, lock, holder, publish, spark)
        except StandbyStopped as stopped:
            summary.stopped_by = str(stopped)
            return summary
        warm_up = False  # the standby warmed up already
    return run_under_lock(
        spec,
        publish,
        summary,
        taken=(lock, spark),
        available_now=available_now,
        max_batches=max_batches,
        warm_up=warm_up,
    )


def stand_by(
    spec: PipelineSpec,
    lock: RunLock,
    holder: Holder,
    publish: Callable[[Event], None],
    spark: SparkSession | None = None,
) -> SparkSession:
    """Warm a session up and wait until ``lock`` (held by ``holder``) is free, then take it; returns the session, the
    lock held. Raises :class:`StandbyStopped` on SIGTERM / SIGINT while waiting."""
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
        spark = spark or run_session(spec)
        _warm_up_and_say(spark, spec, stop, holder, publish)
        gone_at = _wait_for_lock(lock, holder, stop)
    except StandbyStopped as stopped:
        raise StandbyStopped(f"{stopped_by[0]} {stopped}") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    taken_after = time.monotonic() - gone_at
    publish(Notice(spec.name, TOOK_OVER, f"took over from pid {holder} (gone; lock taken {taken_after:.2f} s later)"))
    return spark


def _warm_up_and_say(
    spark: SparkSession,
    spec: PipelineSpec,
    stop: threading.Event,
    holder: Holder,
    publish: Callable[[Event], None],
) -> None:
    try:
        warm = warm_up_on_scratch_copies(spark, spec, start_query, stop)
    except Exception as error:  # noqa: BLE001 - a cold takeover is still a takeover
        publish(
            Notice(
                spec.name,
                STANDBY,
                f"standby warm-up failed ({first_line(error)}); waiting cold for pid {holder} to stop",
            )
        )
        return
    if stop.is_set():
        raise StandbyStopped(f"while warming up to stand by for pid {holder}")
    text = f"standby warm ({warm.describe()}); waiting for pid {holder} to stop"
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
        return [
            pid
            for pid, started in self.members.items()
            if _start_time(pid) == started and process_state(pid) not in ("Z", None)
        ]

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
    info = process_info(pid)
    return str(info.start_ticks) if info is not None else None
