"""What a running pipeline reports: structured events, each a JSON line for programs and a line for people.

A run publishes, in order: a standby's ``standby`` notices (warming up, then warm and waiting) and its
``took_over`` (:mod:`streamproof.pipeline.standby`), ``ready`` (Python up, checkpoint and sinks checked: the
recovery benchmark splits a restart there), ``started`` (the query runs), one ``batch`` per committed batch
(:class:`BatchCommitted`), and
``metrics`` / ``restarting`` notices when they happen; before each sink's write of a batch, a ``writing`` event
(:class:`WriteStarted`, for programs only: the crash harness injects cluster faults on it). People read
:meth:`line` of each shown event on stdout. Programs (the crash harness, the benchmarks, the pytest plugin) read
the JSON lines from the file descriptor that ``$STREAMPROOF_EVENTS_FD`` names in the run's environment
(:func:`side_channel`): no prose is parsed.

Example::

    >>> event = BatchCommitted("orders", 3, rows_in=1000, rows_out=990, quarantined=10, duration_s=1.234, lag=0)
    >>> event.line()
    '[orders] batch 3 committed: 1000 rows in, 990 to sink, 10 quarantined, 810 rows/s, 1.2 s, kafka lag 0'
    >>> decode(encode(event)) == event
    True
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from streamproof.metrics import partition_lag

EVENTS_FD_ENV = "STREAMPROOF_EVENTS_FD"
READY, STARTED, METRICS, RESTARTING, SPARK_UI = "ready", "started", "metrics", "restarting", "spark_ui"
STANDBY, TOOK_OVER = "standby", "took_over"  # a warm standby's waiting, and its taking over (pipeline.standby)
WARMING = "warming"  # run --warm-up: the warm-up before the first batch (pipeline.warm_up)
REPLAYING = "replaying"  # the batches the sinks hold beyond the checkpoint, replayed with their recorded offsets


@dataclass(frozen=True)
class Notice:
    """Something a run says once: ``ready``, ``started``, ``metrics`` (the endpoint), ``restarting`` (an outage)."""

    shown: ClassVar[bool] = True  # printed for people
    pipeline: str
    kind: str
    text: str

    def line(self) -> str:
        return f"[{self.pipeline}] {self.text}"


@dataclass(frozen=True)
class BatchCommitted:
    """One committed batch: Spark wrote ``commits/<batch>`` (its progress is posted only after that).

    ``duplicates_dropped``, ``late`` and ``late_handling`` are set when dedup or windows are on (``windows_closed``
    for windows); ``remark`` carries a disagreement worth reporting (Spark's own late count differing).
    """

    kind: ClassVar[str] = "batch"
    shown: ClassVar[bool] = True
    pipeline: str
    batch_id: int
    rows_in: int
    rows_out: int
    quarantined: int
    duration_s: float
    lag: int | None
    sink_seconds: dict[str, float] = field(default_factory=dict)
    replay_skipped: bool = False
    duplicates_dropped: int | None = None
    windows_closed: int | None = None
    late: int | None = None
    late_handling: str | None = None  # "quarantined" or "dropped"
    remark: str | None = None
    # Where the batch's time went, in order (streamproof.pipeline.phases); for programs, not in the line.
    phases: dict[str, float] = field(default_factory=dict)
    queued_s: float | None = None  # the batch's oldest record's wait in the source before the trigger started
    job: bool = False  # a batch of your job file (streamproof.jobs): rows in, nothing of a pipeline's own terms

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.duration_s if self.duration_s > 0 else 0.0

    def line(self) -> str:
        """The one progress line of the batch."""
        if self.job:
            return (
                f"[{self.pipeline}] batch {self.batch_id} committed: {self.rows_in:,} rows in, "
                f"{self.rows_per_second:,.0f} rows/s, {self.duration_s:.1f} s"
            )
        lag_text = "?" if self.lag is None else str(self.lag)
        line = (
            f"[{self.pipeline}] batch {self.batch_id} committed: {self.rows_in} rows in, {self.rows_out} to sink, "
            f"{self.quarantined} quarantined, {self.rows_per_second:,.0f} rows/s, {self.duration_s:.1f} s, "
            f"kafka lag {lag_text}"
        )
        if len(self.sink_seconds) > 1:
            line += "; " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.sink_seconds.items())
        if self.late_handling is not None:
            done = (
                f"{self.windows_closed} windows closed"
                if self.windows_closed is not None
                else f"{self.duplicates_dropped} duplicates dropped"
            )
            line += f"; {done}, {self.late} late ({self.late_handling})"
        if self.remark:
            line += f" ({self.remark})"
        if self.replay_skipped:
            line += " (replayed batch: the sink already held it and skipped the write)"
        return line


@dataclass(frozen=True)
class WriteStarted:
    """A sink is about to write a batch (after the quarantine): the moment a cluster fault is injected."""

    kind: ClassVar[str] = "writing"
    shown: ClassVar[bool] = False  # for programs: people see the batch's line once it commits
    pipeline: str
    batch_id: int
    sink: str
    application: str = ""  # Spark's application id: on a cluster, what names its executors' processes

    def line(self) -> str:
        return f"[{self.pipeline}] batch {self.batch_id}: writing {self.sink}"


@dataclass(frozen=True)
class WriteMoments:
    """The moments your own sink's write of a batch went through (:mod:`streamproof.your_code.steps`), after it
    returned: how many a crash can land at in the next batch. ``unseen``: durable steps it took in other threads, after
    which no crash can land."""

    kind: ClassVar[str] = "moments"
    shown: ClassVar[bool] = False  # for programs: the crash harness learns a write's moments from it
    pipeline: str
    batch_id: int
    sink: str
    moments: list[str] = field(default_factory=list)
    unseen: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"[{self.pipeline}] batch {self.batch_id}: {self.sink} went through {len(self.moments)} moments"


Event = Notice | BatchCommitted | WriteStarted | WriteMoments


@dataclass
class RunSummary:
    """What a run did so far, updated as batches commit (:meth:`observe`); ``run`` returns it at the end."""

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

    def observe(self, batch: BatchCommitted) -> None:
        self.batches += 1
        self.rows_in += batch.rows_in
        self.rows_out += batch.rows_out
        self.quarantined += batch.quarantined
        self.batch_ids.append(batch.batch_id)
        self.last_rate, self.last_lag = batch.rows_per_second, batch.lag

    def line(self) -> str:
        """The last line of a run.

        >>> RunSummary("orders", batches=2, rows_in=1500, rows_out=1490, quarantined=10, seconds=3.25).line()
        '[orders] stopped (drained): 2 batches, 1,500 rows in, 1,490 to sink, 10 quarantined, 3.2 s'
        """
        return (
            f"[{self.pipeline}] stopped ({self.stopped_by}): {self.batches} batches, {self.rows_in:,} rows in, "
            f"{self.rows_out:,} to sink, {self.quarantined:,} quarantined, {self.seconds:.1f} s"
        )


def encode(event: Event) -> str:
    """The event as one JSON line (no newline)."""
    return json.dumps({"event": event.kind, **asdict(event)})


def decode(text: str) -> Event:
    """The event of one JSON line written by :func:`encode`."""
    data = json.loads(text)
    kind = data.pop("event")
    if kind == BatchCommitted.kind:
        return BatchCommitted(**data)
    if kind == WriteMoments.kind:
        return WriteMoments(**data)
    return WriteStarted(**data) if kind == WriteStarted.kind else Notice(**data)


def side_channel() -> Callable[[Event], None] | None:
    """A writer of JSON lines to ``$STREAMPROOF_EVENTS_FD`` when the run was started with one, else None."""
    fd = os.environ.get(EVENTS_FD_ENV)
    if not fd:
        return None
    stream = os.fdopen(int(fd), "w", buffering=1, encoding="utf-8", closefd=False)
    lock = threading.Lock()  # Spark's listener thread and the batch's thread both publish: one line at a time

    def write(event: Event) -> None:
        with lock:
            stream.write(encode(event) + "\n")

    return write


def kafka_lag(source_progress: dict[str, Any]) -> int | None:
    """Records between the batch's end offsets and the latest offsets seen, summed over partitions.

    Offsets come as JSON text (``query.lastProgress``) or as objects (the listener's ``progress.json``).

    >>> kafka_lag({"endOffset": '{"t":{"0":5,"1":7}}', "latestOffset": {"t": {"0": 9, "1": 7}}})
    4
    """
    lags = partition_lag({"sources": [source_progress]})
    return sum(lag for partitions in lags.values() for lag in partitions.values()) if lags else None
