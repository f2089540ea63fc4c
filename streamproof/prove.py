"""The chaos harness: run a pipeline as a child process, SIGKILL it, restart it, drain, reconcile.

A child is ``python -m streamproof run PIPELINE --available-now`` started with ``setsid``, so that it
leads a process group holding the Python driver and the Spark JVM; every crash is a SIGKILL of that whole
group. The harness restarts the child until one run drains the topic and exits 0; the caller then
reconciles with the same checker as ``streamproof verify``. Three ways to crash:

* **named points** (:func:`run_with_crashes`): the child is armed with ``STREAMPROOF_CRASH_AT=point@batch``
  for the second batch of its run and kills itself there (:mod:`streamproof.faults`). Right after the
  death, before any restart, the harness records on disk what the crash left: whether the offset log,
  Spark's commit log and the sink's log hold the batch.
* **random kills** (:func:`run_with_random_kills`): seeded. For each kill the harness draws ``after``
  (1 to 3 committed batches of the current run) and ``phase`` (uniform in [0, 1)), waits for the
  ``after``-th committed-batch line, then sleeps ``phase`` times that batch's duration and kills:
  a uniformly random point of a batch being written. The moments are printed, to replay a failure.
* **the matrix** (:func:`run_matrix`): every guarantee x every named point, each cell on a fresh topic,
  table and checkpoint holding the same generated data.

A kill that cannot be delivered (the pipeline drained first) is an error, never a silent pass: a harness
that skips its faults proves nothing.

Example::

    >>> result = run_with_crashes(Path("orders.toml"), ["after-sink-commit"], log_dir=Path("logs"))  # doctest: +SKIP
    >>> result.crashes[0].facts                                                                     # doctest: +SKIP
    {'offsets_logged': True, 'checkpoint_committed': False, 'sink_has_batch': True, 'sink_txn': True}
"""

from __future__ import annotations

import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from streamproof import faults
from streamproof.checkpoint import batch_end_offsets, next_batch_to_run
from streamproof.config import (

    DeltaSinkSpec,
    FilesSinkSpec,
    PipelineSpec,
    PostgresSinkSpec,
    dump_pipeline,
    load_pipeline,
)
from streamproof.errors import ConfigError, PipelineError
from streamproof.guarantees import GUARANTEES
from streamproof.pipeline import BATCH_COMMITTED, BATCH_LINE_PATTERN
from streamproof.session import JIT_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamproof.sinks.base import AnySinkSpec
    from streamproof.verify import Report

RUN_TIMEOUT_S = 900.0
Emit = Callable[[str], None]


@dataclass
class Crash:
    """One SIGKILL of the pipeline's process group."""

    point: str
    batch_id: int
    at_s: float  # seconds since the killed run started
    run: int
    restarted_in_s: float | None = None  # kill -> first batch committed by the next run
    detail: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    killed_monotonic: float = field(default=0.0, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("killed_monotonic")
        data["at_s"] = round(self.at_s, 2)
        if self.restarted_in_s is not None:
            data["restarted_in_s"] = round(self.restarted_in_s, 2)
        return data


@dataclass
class TimelineEvent:
    """Something the harness saw, ``t`` seconds after it started: a run started, committed a batch,
    was killed, or exited."""

    t: float
    run: int
    kind: str  # start | batch | kill | exit
    batch: int | None = None
    label: str = ""


@dataclass
class HarnessResult:
    """What the harness saw: the crashes it caused, and the work the pipeline reported."""

    crashes: list[Crash] = field(default_factory=list)
    timeline: list[TimelineEvent] = field(default_factory=list)
    runs: int = 0
    rows_in: int = 0  # summed over runs from the batch lines
    batches: int = 0
    wall_s: float = 0.0
    batch_seconds: float = 0.0
    process_groups: list[int] = field(default_factory=list)  # one per child run (pgid = child pid)

    @property
    def batch_rows_per_second(self) -> float:
        """Rows per second of batch processing time (restarts and start-up excluded)."""
        return self.rows_in / self.batch_seconds if self.batch_seconds > 0 else 0.0

    @property
    def restart_seconds(self) -> list[float]:
        return [c.restarted_in_s for c in self.crashes if c.restarted_in_s is not None]


@dataclass
class ChildRun:
    """A pipeline child process and the lines it printed, each with its arrival time."""

    process: subprocess.Popen[str]
    number: int
    started_at: float
    log_path: Path
    scratch: Path  # Spark's local dirs of this run: a killed JVM cannot delete them, the harness does
    lines: queue.Queue[tuple[float, str | None]] = field(default_factory=queue.Queue)
    committed: list[tuple[float, int, float]] = field(default_factory=list)  # (time, batch id, duration s)
    rows_in: int = 0
    closed_at: float | None = None

    def kill_group(self) -> None:
        """SIGKILL the run's whole process tree: driver, JVM and PySpark's workers (their own group)."""
        faults.kill_process_tree(self.process.pid)
        self.process.wait(timeout=60)

    def next_line(self, timeout_s: float) -> tuple[float, str | None] | None:
        """The next (time, line); line None means the child closed its output. None on timeout."""
        if self.closed_at is not None:
            return self.closed_at, None
        try:
            at, line = self.lines.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if line is None:
            self.closed_at = at
        return at, line


class Harness:
    """Starts, watches and kills pipeline children; keeps the timeline."""

    def __init__(self, pipeline_file: Path, log_dir: Path, emit: Emit, timeout_s: float = RUN_TIMEOUT_S) -> None:
        self.pipeline_file = pipeline_file
        self.log_dir = log_dir
        self.emit = emit
        self.timeout_s = timeout_s
        self.result = HarnessResult()
        self.children: list[ChildRun] = []
        self.began = time.monotonic()
        self._pending_restart: Crash | None = None

    def _t(self, at: float) -> float:
        return round(at - self.began, 3)

    def start(self, crash: faults.ArmedCrash | None = None) -> ChildRun:
        """Start ``streamproof run --available-now`` in its own session; stderr goes to the run's log."""
        number = len(self.children) + 1
        log_path = self.log_dir / f"run-{number}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.log_dir / f"run-{number}.spark-local"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPARK_LOCAL_DIRS": str(scratch)}
        env.setdefault(JIT_ENV, "quick-start")  # each run lives seconds: C1 only halves its CPU on 2 cores
        env.pop(faults.CRASH_ENV, None)
        if crash is not None:
            env[faults.CRASH_ENV] = crash.encode()
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "streamproof", "run", str(self.pipeline_file), "--available-now"],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                start_new_session=True, env=env,
            )  # fmt: skip
        child = ChildRun(process, number, time.monotonic(), log_path, scratch)
        assert process.stdout is not None
        out_path = log_path.with_suffix(".out")  # what the run printed (its stderr is in the .log)
        threading.Thread(target=_pump, args=(process.stdout, child.lines, out_path), daemon=True).start()
        self.children.append(child)
        label = f"armed {crash.encode()}" if crash else ""
        self.result.timeline.append(TimelineEvent(self._t(child.started_at), number, "start", label=label))
        return child

    def _consume(self, child: ChildRun, line: str, at: float) -> None:
        self.emit(line)
        match = BATCH_LINE_PATTERN.search(line)
        if match and BATCH_COMMITTED in line:
            batch = int(match.group(1))
            child.committed.append((at, batch, float(match.group(3))))
            child.rows_in += int(match.group(2))
            self.result.timeline.append(TimelineEvent(self._t(at), child.number, "batch", batch))
            if self._pending_restart is not None:
                self._pending_restart.restarted_in_s = at - self._pending_restart.killed_monotonic
                self._pending_restart = None

    def wait_for_batches(self, child: ChildRun, count: int) -> bool:
        """Forward lines until the child committed ``count`` batches in this run; False if it exited first."""
        deadline = time.monotonic() + self.timeout_s
        while len(child.committed) < count:
            item = child.next_line(deadline - time.monotonic())
            if item is None:
                child.kill_group()
                raise PipelineError(f"no batch committed within {self.timeout_s:.0f} s (killed); log: {child.log_path}")
            at, line = item
            if line is None:
                return False
            self._consume(child, line, at)
        return True

    def sleep_forwarding(self, child: ChildRun, seconds: float) -> bool:
        """Sleep while forwarding lines; False if the child exited during the sleep."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            item = child.next_line(left)
            if item is None:
                return True
            at, line = item
            if line is None:
                return False
            self._consume(child, line, at)
        return child.process.poll() is None

    def wait_for_exit(self, child: ChildRun) -> int:
        """Forward the child's lines until it exits; kill it and raise if it outlives the timeout."""
        deadline = child.started_at + self.timeout_s
        while True:
            item = child.next_line(deadline - time.monotonic())
            if item is None:
                child.kill_group()
                raise PipelineError(
                    f"pipeline run did not finish within {self.timeout_s:.0f} s (killed); log: {child.log_path}"
                )
            at, line = item
            if line is None:
                break
            self._consume(child, line, at)
        code = child.process.wait(timeout=120)
        self.result.timeline.append(TimelineEvent(self._t(time.monotonic()), child.number, "exit", label=str(code)))
        return code

    def record_crash(self, child: ChildRun, crash: Crash) -> None:
        self.result.crashes.append(crash)
        self._pending_restart = crash
        self.result.timeline.append(
            TimelineEvent(self._t(crash.killed_monotonic), child.number, "kill", crash.batch_id, crash.point)
        )

    def drain(self) -> None:
        """Run the pipeline unarmed until it exits 0 (it drains the topic: available-now)."""
        child = self.start()
        code = self.wait_for_exit(child)
        if code != 0:
            raise PipelineError(
                f"pipeline run {child.number} exited with code {code}; last lines of {child.log_path}:\n"
                f"{_log_tail(child.log_path)}"
            )

    def finish(self) -> HarnessResult:
        for child in self.children:
            if child.process.poll() is None:
                child.kill_group()
            shutil.rmtree(child.scratch, ignore_errors=True)
        result = self.result
        result.runs = len(self.children)
        result.process_groups = [child.process.pid for child in self.children]
        result.rows_in = sum(child.rows_in for child in self.children)
        result.batches = sum(len(child.committed) for child in self.children)
        result.batch_seconds = sum(duration for child in self.children for _, _, duration in child.committed)
        result.wall_s = time.monotonic() - self.began
        return result


def _pump(stream: IO[str], lines: queue.Queue[tuple[float, str | None]], copy_to: Path) -> None:
    with open(copy_to, "a", encoding="utf-8") as copy:
        for line in stream:
            copy.write(line)
            copy.flush()
            lines.put((time.monotonic(), line.rstrip("\n")))
    lines.put((time.monotonic(), None))


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def crash_facts(spec: PipelineSpec, batch_id: int) -> dict[str, Any]:
    """What a crash in ``batch_id`` left: offset log, Spark commit log, and whether every sink holds the batch
    (and holds it keyed on the batch: txn id, ledger row, commit marker); for a fan-out, also ``held_by``,
    the labels of the sinks that hold it."""
    from streamproof.sinks.base import open_sinks

    checkpoint = spec.checkpoint_dir
    logged = (checkpoint / "offsets" / str(batch_id)).exists()
    facts: dict[str, Any] = {
        "offsets_logged": logged,
        "checkpoint_committed": (checkpoint / "commits" / str(batch_id)).exists(),
    }
    # A batch id can recur (at-most-once restarts its numbering), so match the batch's offsets too.
    end_offsets = batch_end_offsets(checkpoint, batch_id) if logged else None
    held = {}
    for sink in open_sinks(spec):
        matching = [
            commit for commit in sink.commits()
            if commit.batch_id == batch_id and commit.end_offsets in (None, end_offsets)
        ]  # fmt: skip
        held[sink.name] = (bool(matching), any(commit.keyed for commit in matching))
    facts["sink_has_batch"] = all(has for has, _ in held.values())
    facts["sink_txn"] = all(keyed for _, keyed in held.values())
    if len(held) > 1:
        facts["held_by"] = [name for name, (has, _) in held.items() if has]
    return facts


def run_with_crashes(pipeline_file: Path, points: Iterable[str], *, log_dir: Path, emit: Emit = print,
                     timeout_s: float = RUN_TIMEOUT_S) -> HarnessResult:  # fmt: skip
    """Crash the pipeline once per named point (in order), each in the second batch of its run, then drain."""
    spec = load_pipeline(pipeline_file)
    harness = Harness(pipeline_file, log_dir, emit, timeout_s)
    try:
        labels = [sink.name for sink in spec.sink_specs]
        for where in points:
            point, sink = faults.split_point(where)
            if sink is not None and sink not in labels:
                raise ConfigError(
                    f"--crash-at {where!r}: the pipeline has no sink labelled {sink!r} ({', '.join(labels)})"
                )
            # The second batch of this run: the first may be a replay, the crash should hit a fresh one.
            first = 0 if spec.guarantee == "at-most-once" else next_batch_to_run(spec.checkpoint_dir)
            armed = faults.ArmedCrash(point, first + 1, sink)
            child = harness.start(armed)
            code = harness.wait_for_exit(child)
            killed_at = time.monotonic()
            if code != -signal.SIGKILL:
                raise PipelineError(
                    f"crash {armed.encode()} missed: run {child.number} exited with code {code} instead of dying "
                    f"by SIGKILL (too little data for two batches?); log: {child.log_path}"
                )
            crash = Crash(where, armed.batch_id, killed_at - child.started_at, child.number,
                          facts=crash_facts(spec, armed.batch_id), killed_monotonic=killed_at)  # fmt: skip
            emit(f"crash at {where} in batch {armed.batch_id} (run {child.number}): SIGKILL; on disk: {crash.facts}")
            harness.record_crash(child, crash)
        harness.drain()
    finally:
        result = harness.finish()
    return result


def run_with_random_kills(pipeline_file: Path, *, kills: int, seed: int, log_dir: Path, emit: Emit = print,
                          max_after_batches: int = 3, timeout_s: float = RUN_TIMEOUT_S) -> HarnessResult:  # fmt: skip
    """Run the pipeline to the end of its topic through ``kills`` seeded random SIGKILLs (module docstring)."""
    rng = random.Random(seed)
    harness = Harness(pipeline_file, log_dir, emit, timeout_s)
    try:
        for number in range(1, kills + 1):
            child = harness.start()
            after, phase = rng.randint(1, max_after_batches), rng.random()
            if not harness.wait_for_batches(child, after):
                raise PipelineError(
                    f"kill {number}/{kills} missed: run {child.number} drained before committing {after} batches; "
                    "use more data or a smaller source.max_offsets_per_trigger"
                )
            _, waited_batch, waited_duration = child.committed[-1]
            delay = phase * max(waited_duration, 0.2)
            if not harness.sleep_forwarding(child, delay):
                raise PipelineError(
                    f"kill {number}/{kills} missed: run {child.number} drained {delay:.2f} s after batch "
                    f"{waited_batch}; use more data or a smaller source.max_offsets_per_trigger"
                )
            child.kill_group()
            killed_at = time.monotonic()
            _drain_output(harness, child)  # a commit line printed just before the kill still counts
            in_flight = child.committed[-1][1] + 1
            emit(
                f"kill {number}/{kills}: run {child.number}, {delay:.2f} s after batch {waited_batch} committed "
                f"(after {after}, phase {phase:.2f}): SIGKILL pgid {child.process.pid}, batch {in_flight} in flight"
            )
            harness.record_crash(child, Crash(
                faults.RANDOM, in_flight, killed_at - child.started_at, child.number,
                detail=f"{delay:.2f} s after batch {waited_batch} committed", killed_monotonic=killed_at,
            ))  # fmt: skip
        harness.drain()
    finally:
        result = harness.finish()
    return result


def _drain_output(harness: Harness, child: ChildRun, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (item := child.next_line(deadline - time.monotonic())) is not None and item[1] is not None:
        harness._consume(child, item[1], item[0])


def surviving_processes(process_groups: list[int]) -> list[int]:
    """Pids of live processes still in any of the given process groups (expected: none)."""
    groups, alive = set(process_groups), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            alive.append(int(stat.parent.name))
    return alive


def expected_damage(guarantee: str, point: str, *, has_invalid_records: bool, check: str = "records",
                    partial_writes_visible: bool = False) -> str:  # fmt: skip
    """The damage a guarantee must show when killed at a point: "clean", "duplicated", "lost", or
    "may-duplicate" / "may-lose" where it depends on how far the killed write got.

    A cell that should show damage and does not means the harness missed its fault (a blind harness),
    which is a failure too. Under at-least-once a kill in the middle of the sink write or after it
    duplicates the batch's quarantined records: the quarantine table commits before the sink and is
    appended again on replay; and where the sink shows a write before it is complete (PostgreSQL commits
    per partition, a non-transactional Kafka producer), the part written before the kill is written again.
    A sink holding the latest record per key (``check = "latest"``) absorbs a replay of its own rows.

    >>> expected_damage("at-least-once", "mid-sink-write", has_invalid_records=False)
    'clean'
    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=False, check="latest")
    'clean'
    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=True, check="latest")
    'duplicated'
    """
    if guarantee == "at-least-once":
        if point == faults.AFTER_SINK_COMMIT and check != "latest":
            return "duplicated"
        if point in (faults.MID_SINK_WRITE, faults.AFTER_SINK_COMMIT) and has_invalid_records:
            return "duplicated"  # the quarantine table was appended before the kill
        if point == faults.MID_SINK_WRITE and partial_writes_visible and check != "latest":
            return "may-duplicate"
    if guarantee == "at-most-once" and point == faults.BEFORE_SINK_WRITE:
        return "lost"
    if guarantee == "at-most-once" and point == faults.MID_SINK_WRITE:
        return "may-lose" if partial_writes_visible else "lost"
    return "clean"


@dataclass
class MatrixCell:
    """One guarantee x crash point run, reconciled."""

    guarantee: str
    sink: str
    point: str
    lost: int
    duplicated: int
    unexpected: int
    crashes: list[dict[str, Any]]
    restart_s: float | None
    expected: str  # "clean", "duplicated" or "lost"
    seconds: float
    timeline: list[TimelineEvent] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """What the cell showed: clean, lost, duplicated, lost+duplicated (unexpected rows count as damage)."""
        damage = [name for name, count in (("lost", self.lost), ("duplicated", self.duplicated + self.unexpected))
                  if count]  # fmt: skip
        return "+".join(damage) or "clean"

    @property
    def as_expected(self) -> bool:
        if self.expected == "clean":
            return self.outcome == "clean"
        if self.expected.startswith("may-"):
            return self.outcome in ("clean", self.expected.removeprefix("may-").replace("lose", "lost"))
        if self.guarantee == "at-most-once":
            return self.lost > 0 and self.duplicated == 0 and self.unexpected == 0
        return getattr(self, self.expected) > 0 and self.lost == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "guarantee": self.guarantee, "sink": self.sink, "point": self.point, "lost": self.lost,
            "duplicated": self.duplicated, "unexpected": self.unexpected, "crashes": self.crashes,
            "restart_s": self.restart_s, "expected": self.expected, "outcome": self.outcome,
            "as_expected": self.as_expected, "seconds": round(self.seconds, 1),
            "timeline": [asdict(event) for event in self.timeline],
        }  # fmt: skip


def isolated_sink(sink: AnySinkSpec, workdir: Path) -> AnySinkSpec:
    """The same sink at a fresh location of its own (a matrix cell, a test): a path under ``workdir``, a
    PostgreSQL table or Kafka topic with a suffix derived from ``workdir``."""
    import hashlib

    suffix = hashlib.sha1(str(workdir).encode()).hexdigest()[:10]
    if isinstance(sink, DeltaSinkSpec | FilesSinkSpec):
        return sink.model_copy(update={"path": str(workdir / "tables" / sink.name)})
    if isinstance(sink, PostgresSinkSpec):
        return sink.model_copy(update={"table": f"{sink.table[:48]}_{suffix}"})
    marker = None if sink.marker_topic is None else f"{sink.marker_topic}-{suffix}"
    return sink.model_copy(update={"topic": f"{sink.topic}-{suffix}", "marker_topic": marker})


def cell_spec(spec: PipelineSpec, guarantee: str, topic: str, workdir: Path, max_offsets: int) -> PipelineSpec:
    """The pipeline of one matrix cell: same transform and sink kinds, its own topic, sinks and checkpoint."""
    sinks = {"sink": isolated_sink(spec.sink, workdir)} if spec.sink is not None else {
        "sinks": [isolated_sink(sink, workdir) for sink in spec.sinks]
    }  # fmt: skip
    return spec.model_copy(update={
        "guarantee": guarantee,
        "checkpoint": str(workdir / "checkpoint"),
        "source": spec.source.model_copy(update={"topic": topic, "max_offsets_per_trigger": max_offsets}),
        "transform": spec.transform.model_copy(update={"quarantine": str(workdir / "tables" / "quarantine")}),
        **sinks,
    })  # fmt: skip


def run_matrix(pipeline_file: Path, spark: SparkSession, *, workdir: Path, count: int = 50_000,
               malformed: float = 0.005, seed: int = 1, guarantees: Iterable[str] = GUARANTEES,
               points: Iterable[str] = faults.NAMED_POINTS, emit: Emit = print,
               duplicates: float = 0.0, late: float = 0.0) -> list[MatrixCell]:  # fmt: skip
    """Every guarantee x named crash point on fresh topic/sinks/checkpoint with the same generated data
    (``malformed``, ``duplicates`` and ``late`` shares: :func:`streamproof.generator.order_events`).

    One cell per sink of the pipeline (a fan-out pipeline gives one cell per sink for each run).
    """
    from streamproof.config import parse_pipeline
    from streamproof.generator import generate
    from streamproof.sinks.base import open_sinks
    from streamproof.verify import verify_pipeline

    spec = load_pipeline(pipeline_file)
    if spec.source.kind != "kafka":
        raise ConfigError(
            f"--matrix generates its data into Kafka topics and needs a kafka source, not {spec.source.kind}: "
            "prove this pipeline with --crash-at POINT or --random-kills K on its own data"
        )
    if spec.transform.watermark is not None and "at-most-once" in (guarantees := tuple(guarantees)):
        emit("at-most-once skipped: a pipeline with dedup or windows refuses it (its restarts lose Spark's state)")
        guarantees = tuple(g for g in guarantees if g != "at-most-once")
    stamp = time.strftime("%Y%m%dT%H%M%S")
    max_offsets = max(100, -(-count // 3))  # three batches: one committed before the crash in batch 1, one after
    cells = []
    for guarantee in guarantees:
        for point in points:
            started = time.monotonic()
            name = f"{guarantee}-{point}"
            emit(f"── cell {name} ──")
            cell_dir = workdir / name
            topic = f"{spec.source.topic}-matrix-{stamp}-{name}"
            generate(spec.source.bootstrap_servers, topic, count, partitions=4, malformed=malformed, seed=seed,
                     duplicates=duplicates, late=late)  # fmt: skip
            cell_file = cell_dir / "pipeline.toml"
            cell_dir.mkdir(parents=True, exist_ok=True)
            cell_file.write_text(dump_pipeline(cell_spec(spec, guarantee, topic, cell_dir, max_offsets)))
            harness = run_with_crashes(cell_file, [point], log_dir=cell_dir / "logs", emit=emit)
            cell_pipeline = parse_pipeline(cell_file.read_text(), source_name=str(cell_file))
            reports: list[Report] = verify_pipeline(spark, cell_pipeline)
            restarts = harness.restart_seconds
            for sink, report in zip(open_sinks(cell_pipeline), reports, strict=True):
                cell = MatrixCell(
                    guarantee=guarantee, sink=report.sink, point=point, lost=report.lost,
                    duplicated=report.duplicated, unexpected=report.unexpected,
                    crashes=[crash.to_dict() for crash in harness.crashes],
                    restart_s=round(restarts[0], 2) if restarts else None,
                    expected=expected_damage(guarantee, point, has_invalid_records=malformed > 0,
                                             check=sink.check.kind, partial_writes_visible=sink.partial_writes_visible),
                    seconds=time.monotonic() - started, timeline=harness.timeline,
                )  # fmt: skip
                emit(f"   {name} [{report.sink}]: lost {cell.lost}, duplicated {cell.duplicated}, "
                     f"unexpected {cell.unexpected} -> {cell.outcome} (expected {cell.expected})")  # fmt: skip
                cells.append(cell)
    return cells
