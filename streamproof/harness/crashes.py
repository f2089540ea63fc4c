"""The crash harness: run a pipeline as a child process, SIGKILL it, restart it, drain; the caller reconciles.

Every run is a :class:`~streamproof.harness.child.PipelineChild` (its own process group: the Python driver, the
Spark JVM and PySpark's workers); every crash is a SIGKILL of that whole tree. The harness restarts the pipeline
until one run drains the source and exits 0; the caller then reconciles with the same checker as
``streamproof verify``. Two ways to crash:

* **named points** (:func:`run_with_crashes`): the child is armed with ``STREAMPROOF_CRASH_AT=point@batch``
  for the second batch of its run and kills itself there (:mod:`streamproof.faults.points`). Right after the
  death, before any restart, the harness records on disk what the crash left (:mod:`streamproof.harness.evidence`):
  whether the offset log, Spark's commit log and the sink's log hold the batch, and which writes had begun; facts
  that do not fit the point make it a missed fault, and the proof fails.
* **random kills** (:mod:`streamproof.harness.random_kills`): seeded, at uniformly random moments of a batch
  being written, on the same :class:`Harness`.

A kill that cannot be delivered (the pipeline drained first, even a moment before the SIGKILL: a killed run must
end by SIGKILL) is an error, never a silent pass: a harness that skips its faults proves nothing.

Example::

    >>> result = run_with_crashes(Path("orders.toml"), ["after-sink-commit"], log_dir=Path("logs"))  # doctest: +SKIP
    >>> result.crashes[0].facts                                                                     # doctest: +SKIP
    {'offsets_logged': True, 'checkpoint_committed': False, 'sink_has_batch': True, 'sink_txn': True}
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamproof.checkpoint.log import next_batch_to_run
from streamproof.config import PipelineSpec, PythonSinkSpec, dump_pipeline, load_pipeline
from streamproof.errors import ConfigError, PipelineError, log_tail
from streamproof.faults import points as faults
from streamproof.harness.child import RUN_TIMEOUT_S, PipelineChild
from streamproof.harness.cluster import (
    SPECULATION_CONF,
    ClusterFaults,
    event_log_conf,
    fault_happened,
    write_attempts,
)
from streamproof.harness.evidence import crash_facts, crash_happened
from streamproof.jvm.session import local_session
from streamproof.pipeline.events import BatchCommitted, Event, WriteMoments, WriteStarted
from streamproof.your_code.steps import MOMENTS_CRASHED, landed

Emit = Callable[[str], None]


@dataclass
class Crash:
    """One SIGKILL of the pipeline's process tree."""

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
    rows_in: int = 0  # summed over runs from the batch events
    batches: int = 0
    wall_s: float = 0.0
    batch_seconds: float = 0.0
    process_groups: list[int] = field(default_factory=list)  # one per child run (pgid = child pid)
    missed: list[str] = field(default_factory=list)  # faults whose evidence is missing: a failure
    missed_at: list[str] = field(default_factory=list)  # where each of ``missed`` was armed (``point[:sink]``)
    # Your own sinks, by label (streamproof.your_code.steps): the moments the last clean write of a fresh batch went
    # through (where mid-sink-write#1..#n can crash it), those of every such write (a crash's landing must be one of
    # them), and the durable steps they took in other threads, after which no crash can land.
    moments: dict[str, list[str]] = field(default_factory=dict)
    seen_moments: dict[str, list[list[str]]] = field(default_factory=dict)
    unseen: dict[str, list[str]] = field(default_factory=dict)

    @property
    def batch_rows_per_second(self) -> float:
        """Rows per second of batch processing time (restarts and start-up excluded)."""
        return self.rows_in / self.batch_seconds if self.batch_seconds > 0 else 0.0

    @property
    def restart_seconds(self) -> list[float]:
        return [c.restarted_in_s for c in self.crashes if c.restarted_in_s is not None]


@dataclass
class HarnessRun:
    """One child run as the harness consumed it: its batches, each with the time the harness saw it."""

    child: PipelineChild
    number: int
    committed: list[tuple[float, BatchCommitted]] = field(default_factory=list)
    writes_started: list[tuple[int, str]] = field(default_factory=list)  # (batch id, sink label), as they began
    moments: list[WriteMoments] = field(default_factory=list)  # your sinks' writes, as they returned


class Harness:
    """Starts, watches and kills pipeline children; keeps the timeline."""

    def __init__(self, pipeline_file: Path, log_dir: Path, emit: Emit, timeout_s: float = RUN_TIMEOUT_S) -> None:
        self.pipeline_file = pipeline_file
        self.log_dir = log_dir
        self.emit = emit
        self.timeout_s = timeout_s
        self.result = HarnessResult()
        self.runs: list[HarnessRun] = []
        self.began = time.monotonic()
        self._pending_restart: Crash | None = None

    def _t(self, at: float) -> float:
        return round(at - self.began, 3)

    def start(self, crash: faults.ArmedCrash | list[faults.ArmedCrash] | None = None) -> HarnessRun:
        """Start ``streamproof run --available-now`` in its own session, armed with ``crash`` (or several) if given."""
        number = len(self.runs) + 1
        run = HarnessRun(PipelineChild(self.pipeline_file, self.log_dir, name=f"run-{number}", crash=crash), number)
        self.runs.append(run)
        crashes = [crash] if isinstance(crash, faults.ArmedCrash) else crash or []
        label = f"armed {','.join(armed.encode() for armed in crashes)}" if crashes else ""
        self.result.timeline.append(TimelineEvent(self._t(run.child.started_at), number, "start", label=label))
        return run

    def _consume(self, run: HarnessRun, at: float, event: Event) -> None:
        if event.shown:
            self.emit(event.line())
        if isinstance(event, WriteStarted):
            run.writes_started.append((event.batch_id, event.sink))
        if isinstance(event, WriteMoments):
            run.moments.append(event)
            if event.unseen:
                self.result.unseen.setdefault(event.sink, []).extend(event.unseen)
            # A run's first batch may be a replay, whose write may differ from a fresh batch's.
            if run.number == 1 or event.batch_id != run.moments[0].batch_id:
                self.result.moments[event.sink] = event.moments
                self.result.seen_moments.setdefault(event.sink, []).append(event.moments)
        if not isinstance(event, BatchCommitted):
            return
        run.committed.append((at, event))
        self.result.timeline.append(TimelineEvent(self._t(at), run.number, "batch", event.batch_id))
        if self._pending_restart is not None:
            self._pending_restart.restarted_in_s = at - self._pending_restart.killed_monotonic
            self._pending_restart = None

    def _next_event(self, run: HarnessRun, deadline: float, missing: str) -> tuple[float, Event | None]:
        """The run's next event; past ``deadline`` the run is killed and ``missing`` is the error's first words."""
        item = run.child.next_event(deadline - time.monotonic())
        if item is None:
            run.child.kill_tree()
            raise PipelineError(f"{missing} within {self.timeout_s:.0f} s (killed); log: {run.child.log_path}")
        return item

    def wait_for_batches(self, run: HarnessRun, count: int) -> bool:
        """Forward events until the run committed ``count`` batches; False if it exited first."""
        deadline = time.monotonic() + self.timeout_s
        while len(run.committed) < count:
            at, event = self._next_event(run, deadline, "no batch committed")
            if event is None:
                return False
            self._consume(run, at, event)
        return True

    def sleep_forwarding(self, run: HarnessRun, seconds: float) -> bool:
        """Sleep while forwarding events; False if the run exited during the sleep."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            item = run.child.next_event(left)
            if item is None:
                return True
            at, event = item
            if event is None:
                return False
            self._consume(run, at, event)
        return run.child.process.poll() is None

    def forward_remaining(self, run: HarnessRun, timeout_s: float = 10.0) -> None:
        """Forward what a killed run sent before it died: a batch committed just before the kill still counts."""
        deadline = time.monotonic() + timeout_s
        while (item := run.child.next_event(deadline - time.monotonic())) is not None and item[1] is not None:
            self._consume(run, item[0], item[1])

    def wait_for_exit(self, run: HarnessRun) -> int:
        """Forward the run's events until it exits; kill it and raise if it outlives the timeout."""
        deadline = run.child.started_at + self.timeout_s
        while True:
            at, event = self._next_event(run, deadline, "pipeline run did not finish")
            if event is None:
                break
            self._consume(run, at, event)
        code = run.child.wait(timeout_s=120)
        self.result.timeline.append(TimelineEvent(self._t(time.monotonic()), run.number, "exit", label=str(code)))
        return code

    def record_crash(self, run: HarnessRun, crash: Crash) -> None:
        self.result.crashes.append(crash)
        self._pending_restart = crash
        self.result.timeline.append(
            TimelineEvent(self._t(crash.killed_monotonic), run.number, "kill", crash.batch_id, crash.point)
        )

    def kill(self, run: HarnessRun, what: str) -> float:
        """SIGKILL the run's process tree and check that the kill landed: the run must end by SIGKILL. One that had
        ended on its own just before (drained, or failed) was not killed, and proved nothing: that is ``what`` missed,
        an error with its exit code and log. Returns the moment of the kill (monotonic)."""
        killed_at = run.child.kill_tree()
        code = run.child.process.returncode
        if code != -signal.SIGKILL:
            hint = " (it drained first: use more data or a smaller source.max_offsets_per_trigger)" if code == 0 else ""
            raise PipelineError(
                f"{what} missed: run {run.number} exited with code {code} instead of dying by SIGKILL"
                f"{hint}; log: {run.child.log_path}"
            )
        return killed_at

    def miss(self, where: str, line: str) -> None:
        """A fault armed at ``where`` left no evidence of happening: ``line`` says why (the proof fails)."""
        self.result.missed.append(line)
        self.result.missed_at.append(where)
        self.emit(f"MISSED {line}")

    def drain(self) -> None:
        """Run the pipeline unarmed until it exits 0 (it drains the source: available-now)."""
        run = self.start()
        code = self.wait_for_exit(run)
        if code != 0:
            raise PipelineError(
                f"pipeline run {run.number} exited with code {code}; last lines of {run.child.log_path}:\n"
                f"{log_tail(run.child.log_path)}"
            )

    def finish(self) -> HarnessResult:
        for run in self.runs:
            run.child.close()
        result = self.result
        result.runs = len(self.runs)
        result.process_groups = [run.child.pid for run in self.runs]
        batches = [batch for run in self.runs for _, batch in run.committed]
        result.rows_in = sum(batch.rows_in for batch in batches)
        result.batches = len(batches)
        result.batch_seconds = sum(batch.duration_s for batch in batches)
        result.wall_s = time.monotonic() - self.began
        return result


def run_with_crashes(
    pipeline_file: Path,
    points: Iterable[str],
    *,
    log_dir: Path,
    emit: Emit = print,
    timeout_s: float = RUN_TIMEOUT_S,
    cluster: ClusterFaults | None = None,
    learned: dict[str, list[list[str]]] | None = None,
) -> HarnessResult:
    """Crash the pipeline once per point (in order), each in the second batch of its run, then drain. Faults of
    the machines, which a run survives, share one run, a batch each (:func:`runs_of`); the last such run drains.

    A point of the machines (``executor-mid-write``, ``worker-loss``, ``datanode-restart``, ``speculation``) needs the
    pipeline on a cluster (``[spark] master``; HDFS for the DataNode) and ``cluster``, the daemons it breaks.

    ``mid-sink-write`` in your own sink (:func:`your_moment`): without ``#k``, each moment of its write in turn, as many
    as a clean batch went through; ``learned``: the moments clean batches of the same pipeline went through elsewhere
    (a matrix's earlier cell), which a crash's landing is checked against too.
    """
    spec = load_pipeline(pipeline_file)
    points = list(points)
    on_cluster = not spec.spark.master.startswith("local")
    if spec.on_distributed_storage:  # what a crash left is read through Hadoop's FileSystem, in a JVM of our own
        local_session(spec.spark, app_name=f"streamproof-harness:{spec.name}")
    if on_cluster:  # Spark's event log: the evidence of the task attempts a fault caused
        pipeline_file = _with_conf(
            spec,
            log_dir / "pipeline.toml",
            event_log_conf(log_dir / "spark-events"),
            any(faults.split_point(p)[0] == faults.SPECULATION for p in points),
        )
    harness = Harness(pipeline_file, log_dir, emit, timeout_s)
    for sink_label, lists in (learned or {}).items():
        harness.result.seen_moments.setdefault(sink_label, []).extend(lists)
    try:
        labels = [sink.name for sink in spec.sink_specs]
        for where in points:
            point, sink = faults.split_point(where)
            if sink is not None and sink not in labels:
                raise ConfigError(
                    f"--crash-at {where!r}: the pipeline has no sink labelled {sink!r} ({', '.join(labels)})"
                )
            if point in faults.CLUSTER_POINTS and not on_cluster:
                raise ConfigError(
                    f'--crash-at {point}: a fault of a cluster\'s machines needs [spark] master = "spark://..." '
                    "(`streamproof infra up --spark-workers 2 --hdfs`, docs/cluster.md)"
                )
        yours = {sink.name for sink in spec.sink_specs if isinstance(sink, PythonSinkSpec)}
        groups, drained, number, expanded = runs_of(points), False, 0, set()
        while number < len(groups):
            group, number = groups[number], number + 1
            # The second batch of this run: the first may be a replay, the crash should hit a fresh one. An
            # at-most-once start numbers its batches from 0 again (it wipes Spark's logs).
            fresh_numbering = spec.wiring.progress_before_write
            first = 0 if fresh_numbering else next_batch_to_run(spec.checkpoint_dir)
            if faults.split_point(group[0])[0] in faults.CLUSTER_POINTS:
                last = number == len(groups)  # then the run that survives its faults drains the source too
                drained = _survive_faults(harness, group, first + 1, cluster, log_dir / "spark-events", last)
                continue
            (where,) = group
            point, sink = faults.split_point(where)
            target = sink or labels[0]
            moment = faults.split_moment(where)[1]
            armed = faults.ArmedCrash(point, first + 1, sink, moment)
            run = harness.start(armed)
            code = harness.wait_for_exit(run)
            killed_at = time.monotonic()
            if code != -signal.SIGKILL:
                why = "too little data for two batches?" if code == 0 else f"it failed: {_error_line(run)}"
                raise PipelineError(
                    f"crash {armed.encode()} missed: run {run.number} exited with code {code} instead of dying "
                    f"by SIGKILL ({why}); log: {run.child.log_path}"
                )
            started = [sink for batch, sink in run.writes_started if batch == armed.batch_id]
            crash = Crash(
                where,
                armed.batch_id,
                killed_at - run.child.started_at,
                run.number,
                facts=crash_facts(spec, armed.batch_id, started),
                killed_monotonic=killed_at,
            )
            yours_hit = point == faults.MID_SINK_WRITE and target in yours
            if yours_hit:
                crash.facts["moment"] = landed(run.child.log_path.parent / "faults", armed.batch_id, target)
            emit(f"crash at {where} in batch {armed.batch_id} (run {run.number}): SIGKILL; on disk: {crash.facts}")
            harness.record_crash(run, crash)
            if missing := crash_happened(point, crash.facts, target):
                harness.miss(where, f"{missing}; log: {run.child.log_path}")
            elif yours_hit:
                found = your_moment(crash.facts.get("moment"), moment or 1, harness.result.seen_moments.get(target))
                if found is not None and where in expanded and not crash.facts["moment"].get("reached", True):
                    emit(f"{where}: {found} (its moments end there; the crash came when the write returned)")
                    groups[number:] = [group for group in groups[number:] if group[0] not in expanded]
                elif found is not None:
                    harness.miss(where, f"{found}; log: {run.child.log_path}")
            if yours_hit and moment is None:  # every moment of your write in turn: a clean batch taught how many
                learned_here = harness.result.moments.get(target, [])
                if len(learned_here) > MOMENTS_CRASHED:
                    emit(
                        f"{target}'s write went through {len(learned_here)} moments: the first {MOMENTS_CRASHED} are "
                        "crashed; the rest are not exercised"
                    )
                more = [f"{where}#{k}" for k in range(2, min(len(learned_here), MOMENTS_CRASHED) + 1)]
                expanded |= set(more)
                groups[number:number] = [[point_k] for point_k in more]
        for target in sorted(yours):
            took = harness.result.unseen.get(target)
            if took and any(
                faults.split_point(where)[0] == faults.MID_SINK_WRITE
                and (faults.split_point(where)[1] or labels[0]) == target
                for where in points
            ):
                harness.miss(
                    f"{faults.MID_SINK_WRITE}:{target}",
                    f"{target}'s write took durable steps in another "
                    f"thread than its own ({', '.join(sorted(set(took)))}): no crash can land after them, so "
                    "its moments were not all exercised",
                )
        if not drained:
            harness.drain()
    finally:
        result = harness.finish()
    return result


def _error_line(run: HarnessRun) -> str:
    """The run's own error line (``error: ...`` on its stderr), or the last line of its log."""
    lines = log_tail(run.child.log_path, 200).splitlines()
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return (errors or lines or ["(no log)"])[-1][:500]


def your_moment(landing: dict[str, Any] | None, moment: int, seen: list[list[str]] | None) -> str | None:
    """Why a crash armed at your write's ``moment`` did not land where a clean batch said that moment is (None: it
    did), in one line: no landing recorded, the write went through fewer moments (``reached`` False), or it landed at a
    moment no clean batch had at that place (the write's moments differ from batch to batch, so the moment planned
    was not the one crashed).

    >>> seen = [["after step 1: save data", "after step 2: save control"]]
    >>> your_moment({"what": "after step 2: save control", "reached": True}, 2, seen) is None
    True
    >>> your_moment({"what": "in a task of step 2 (foreachPartition), after its psycopg commit 1"}, 2, seen)[:55]
    "moment 2 landed at 'in a task of step 2 (foreachPartiti"
    """
    if landing is None:
        return "the kill came from no moment of the write"
    if not landing.get("reached", True):
        return str(landing["what"])
    at_moment = {moments[moment - 1] for moments in seen or [] if len(moments) >= moment}
    if at_moment and landing["what"] not in at_moment:
        return (
            f"moment {moment} landed at {landing['what']!r}, where clean batches had "
            f"{' / '.join(map(repr, sorted(at_moment)))}: the write's moments differ from batch to batch, so the "
            "moment planned was not the one crashed"
        )
    return None


def runs_of(points: list[str]) -> list[list[str]]:
    """The points grouped into runs: a crash of the pipeline ends its run, so each has one of its own; faults of the
    machines, which the run survives, share one, a batch each.

    >>> runs_of(["after-sink-commit", "executor-mid-write", "speculation:pg", "worker-loss", "mid-sink-write"])
    [['after-sink-commit'], ['executor-mid-write', 'speculation:pg', 'worker-loss'], ['mid-sink-write']]
    """
    groups: list[list[str]] = []
    for where in points:
        machine = faults.split_point(where)[0] in faults.CLUSTER_POINTS
        if machine and groups and faults.split_point(groups[-1][0])[0] in faults.CLUSTER_POINTS:
            groups[-1].append(where)
        else:
            groups.append([where])
    return groups


def _with_conf(spec: PipelineSpec, target: Path, conf: dict[str, str], speculation: bool) -> Path:
    """A copy of the pipeline file whose runs also set ``conf`` (and speculation, when asked) in Spark."""
    extra = {**conf, **(SPECULATION_CONF if speculation else {})}
    settings = spec.spark.model_copy(update={"conf": {**spec.spark.conf, **extra}})
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dump_pipeline(spec.model_copy(update={"spark": settings})))
    return target


def _survive_faults(
    harness: Harness,
    wheres: list[str],
    first_batch: int,
    cluster: ClusterFaults | None,
    event_logs: Path,
    drain: bool = False,
) -> bool:
    """One run through faults of the machines, the i-th of ``wheres`` in batch ``first_batch + i``, met inside the
    write's tasks (:mod:`streamproof.faults.in_tasks`); for ``datanode-restart`` the harness breaks the DataNode while
    the task waits. The run is expected to survive them; it is stopped (SIGTERM) once the last faulted batch is
    committed, unless it is to ``drain`` the source (then True when it did), and a Worker a fault killed is started
    again. Spark's event log must show each fault happened, else it is recorded as missed in ``harness.result``
    (a fault that never fired proves nothing: the proof fails)."""
    planned = {first_batch + number: where for number, where in enumerate(wheres)}
    split = {batch: faults.split_point(where) for batch, where in planned.items()}  # batch -> (point, sink)
    if cluster is None:
        raise ConfigError(
            f"--crash-at {', '.join(wheres)}: the harness needs the cluster's daemons (`streamproof infra up "
            "--spark-workers 2 --hdfs`, the same --state-dir)"
        )
    run = harness.start([faults.ArmedCrash(point, batch, sink) for batch, (point, sink) in split.items()])
    fault_dir = run.child.log_path.parent / "faults"
    crashes = {batch: Crash(where, batch, 0.0, run.number) for batch, where in planned.items()}
    last, stopping = max(planned), False
    deadline = time.monotonic() + harness.timeout_s
    while True:
        at, event = harness._next_event(run, deadline, f"batch {last} (the last faulted) was not committed")
        if event is None:
            break
        harness._consume(run, at, event)
        if isinstance(event, WriteStarted) and event.batch_id in planned:
            crash, (point, sink) = crashes[event.batch_id], split[event.batch_id]
            if not crash.killed_monotonic and sink in (None, event.sink):
                if point == faults.DATANODE_RESTART:
                    crash.facts = cluster.restart_datanode_under(fault_dir, f"{point}@{event.batch_id}")
                crash.killed_monotonic = time.monotonic()
                crash.at_s = crash.killed_monotonic - run.child.started_at
                harness.record_crash(run, crash)
        elif isinstance(event, BatchCommitted) and event.batch_id in planned:
            crashes[event.batch_id].facts.update(cluster.restore())
            if event.batch_id == last and not stopping and not drain:
                run.child.terminate()  # the faults are behind; the rest of the source is the drain's
                stopping = True
    code = run.child.wait(timeout_s=120)
    harness.result.timeline.append(TimelineEvent(harness._t(time.monotonic()), run.number, "exit", label=str(code)))
    for batch, crash in crashes.items():
        if not crash.killed_monotonic:
            harness.miss(
                crash.point,
                f"{crash.point}: run {run.number} ended (exit {code}) before batch {batch} "
                f"was written (use more data); log: {run.child.log_path}",
            )
            continue
        point, sink = split[batch]
        crash.facts.update(pipeline_exit=code, **write_attempts(event_logs, batch, sink))
        harness.emit(f"{crash.point} in batch {batch} (run {run.number}): {crash.facts}")
        if missed := fault_happened(point, crash.facts):
            harness.miss(
                crash.point,
                f"{crash.point} in batch {batch}: {missed.split(': ', 1)[1]}; logs: {run.child.log_path}, {event_logs}",
            )
    return drain and code == 0
